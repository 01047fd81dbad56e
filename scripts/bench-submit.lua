-- wrk script for scripts/bench-submit.sh: each request submits a distinct one-task job through
-- the Connect JSON API (LaunchJob).
local counter = 0
local threads = {}
function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end
function init(args)
  run = tostring(os.time()) .. tostring(math.random(1000000))
  counter = 0
end
request = function()
  counter = counter + 1
  local body = string.format('{"name":"/bench/w%s-%d-%d","entrypoint":{"runCommand":{"argv":["true"]}},"resources":{"cpuMillicores":100,"memoryBytes":"1073741824"},"replicas":1,"maxRetriesPreemption":1000}', run, tid, counter)
  return wrk.format("POST", "/iris.cluster.ControllerService/LaunchJob", {["Content-Type"]="application/json"}, body)
end
