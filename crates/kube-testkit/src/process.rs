//! Running a container as a local process: the container's filesystem view mapped into a per-pod
//! directory, its environment resolved as the kubelet would, output captured as the pod log.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use base64::Engine;
use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::watch;

use crate::cluster::{Cluster, Shared};
use crate::resources::id;
use crate::store::{meta_str, name_of, uid_of};

/// A container's combined stdout/stderr, line by line with the time each line arrived.
pub(crate) struct LogBuffer {
    lines: Mutex<Vec<(DateTime<Utc>, Vec<u8>)>>,
    version: watch::Sender<usize>,
    closed: AtomicBool,
}

impl LogBuffer {
    pub(crate) fn new() -> Arc<Self> {
        let (version, _) = watch::channel(0);
        Arc::new(Self {
            lines: Mutex::new(Vec::new()),
            version,
            closed: AtomicBool::new(false),
        })
    }

    fn lines(&self) -> std::sync::MutexGuard<'_, Vec<(DateTime<Utc>, Vec<u8>)>> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn push(&self, line: Vec<u8>) {
        let n = {
            let mut l = self.lines();
            l.push((Utc::now(), line));
            l.len()
        };
        self.version.send_replace(n);
    }

    /// No more lines will come (the container ended).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let n = self.lines().len();
        self.version.send_replace(n);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Lines from index `from` on.
    pub(crate) fn since(&self, from: usize) -> Vec<(DateTime<Utc>, Vec<u8>)> {
        self.lines().iter().skip(from).cloned().collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.lines().len()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<usize> {
        self.version.subscribe()
    }
}

/// How a container process ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Exit {
    pub code: i32,
    pub finished_at: String,
    pub message: Option<String>,
}

/// What to run: argv (empty = nothing to run), environment and working directory.
#[derive(Debug, Clone)]
pub(crate) struct ProcSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
}

/// Why a container cannot be started yet (`waiting` reason and message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NotReady {
    pub reason: &'static str,
    pub message: String,
}

/// The per-pod directory layout.
#[derive(Debug, Clone)]
pub(crate) struct PodDirs {
    pub root: PathBuf,
    pub node_root: PathBuf,
}

impl PodDirs {
    pub(crate) fn home(&self) -> PathBuf {
        self.root.join("home")
    }
}

fn sanitize(path: &str) -> String {
    path.trim_matches('/').replace('/', "_")
}

fn secret_or_cm(
    cl: &Cluster,
    secret: bool,
    ns: &str,
    name: &str,
) -> Option<BTreeMap<String, Vec<u8>>> {
    let res = if secret { id::SECRETS } else { id::CONFIGMAPS };
    let obj = cl.store.get(res, ns, name)?;
    let mut out = BTreeMap::new();
    let b64 = base64::engine::general_purpose::STANDARD;
    let fields: &[(&str, bool)] = if secret {
        &[("data", true), ("stringData", false)]
    } else {
        &[("data", false), ("binaryData", true)]
    };
    for (field, encoded) in fields {
        if let Some(m) = obj.get(*field).and_then(Value::as_object) {
            for (k, v) in m {
                let s = v.as_str().unwrap_or_default();
                let bytes = if *encoded {
                    b64.decode(s).unwrap_or_default()
                } else {
                    s.as_bytes().to_vec()
                };
                out.insert(k.clone(), bytes);
            }
        }
    }
    Some(out)
}

/// Creates the pod's volumes on disk (emptyDir, hostPath per node, secret and configMap files)
/// and returns volume name → local directory.
pub(crate) fn materialize_volumes(
    cl: &Cluster,
    pod: &Value,
    dirs: &PodDirs,
) -> Result<HashMap<String, PathBuf>, NotReady> {
    let ns = meta_str(pod, "namespace");
    let mut out = HashMap::new();
    let vols = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for v in vols {
        let vname = v
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let local = if let Some(hp) = v.pointer("/hostPath/path").and_then(Value::as_str) {
            dirs.node_root.join("hostpath").join(sanitize(hp))
        } else {
            dirs.root.join("volumes").join(&vname)
        };
        std::fs::create_dir_all(&local).map_err(|e| NotReady {
            reason: "ContainerCreating",
            message: format!("MountVolume.SetUp failed for volume \"{vname}\" : {e}"),
        })?;
        for (key, secret) in [("secret", true), ("configMap", false)] {
            let Some(src) = v.get(key) else { continue };
            let obj_name = src
                .get(if secret { "secretName" } else { "name" })
                .and_then(Value::as_str)
                .unwrap_or_default();
            let optional = src
                .get("optional")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            match secret_or_cm(cl, secret, ns, obj_name) {
                Some(data) => {
                    let items = src.get("items").and_then(Value::as_array);
                    for (k, bytes) in data {
                        let rel = match items {
                            Some(items) => match items.iter().find(|i| i.get("key").and_then(Value::as_str) == Some(&k)) {
                                Some(i) => i.get("path").and_then(Value::as_str).unwrap_or(&k).to_string(),
                                None => continue,
                            },
                            None => k.clone(),
                        };
                        let target = local.join(rel);
                        if let Some(parent) = target.parent() {
                            let _ = std::fs::create_dir_all(parent);
                        }
                        std::fs::write(&target, bytes).map_err(|e| NotReady {
                            reason: "ContainerCreating",
                            message: format!("MountVolume.SetUp failed for volume \"{vname}\" : {e}"),
                        })?;
                    }
                }
                None if optional => {}
                None => {
                    return Err(NotReady {
                        reason: "ContainerCreating",
                        message: format!(
                            "MountVolume.SetUp failed for volume \"{vname}\" : {} \"{obj_name}\" not found",
                            if secret { "secret" } else { "configmap" }
                        ),
                    })
                }
            }
        }
        out.insert(vname, local);
    }
    Ok(out)
}

/// Replaces container paths (`/app`, `/app/x`, `"/app"`) by their local directories, at path
/// boundaries only, longest container path first.
pub(crate) fn rewrite_paths(s: &str, map: &[(String, String)]) -> String {
    // One left-to-right pass, trying the mappings in the caller's order (longest first) at each
    // path boundary: a replacement is never rewritten again (a volume's directory under /tmp
    // must not be remapped by the pod's own /tmp mount).
    let starts_path =
        |c: char| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '$' | '~'));
    let ends_path = |c: char| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.'));
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut prev: Option<char> = None;
    'scan: while i < s.len() {
        let rest = &s[i..];
        if prev.is_none_or(starts_path) {
            for (from, to) in map {
                if from.is_empty() || from == "/" {
                    continue;
                }
                if let Some(after) = rest.strip_prefix(from.as_str()) {
                    if after.chars().next().is_none_or(ends_path) {
                        out.push_str(to);
                        prev = from.chars().last();
                        i += from.len();
                        continue 'scan;
                    }
                }
            }
        }
        let Some(c) = rest.chars().next() else { break };
        out.push(c);
        prev = Some(c);
        i += c.len_utf8();
    }
    out
}

/// Kubernetes `$(VAR)` expansion (`$$(` escapes).
pub(crate) fn expand(s: &str, env: &HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let tail = &rest[pos..];
        if let Some(t) = tail.strip_prefix("$$") {
            out.push('$');
            rest = t;
        } else if let Some(t) = tail.strip_prefix("$(") {
            match t.find(')') {
                Some(end) => {
                    let var = &t[..end];
                    match env.get(var) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(var);
                            out.push(')');
                        }
                    }
                    rest = &t[end + 1..];
                }
                None => {
                    out.push_str(tail);
                    rest = "";
                }
            }
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

fn field_ref(pod: &Value, path: &str) -> String {
    let meta_map = |field: &str, key: &str| {
        pod.pointer(&format!("/metadata/{field}"))
            .and_then(|m| m.get(key))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    if let Some(k) = path
        .strip_prefix("metadata.labels['")
        .and_then(|r| r.strip_suffix("']"))
    {
        return meta_map("labels", k);
    }
    if let Some(k) = path
        .strip_prefix("metadata.annotations['")
        .and_then(|r| r.strip_suffix("']"))
    {
        return meta_map("annotations", k);
    }
    match path {
        "metadata.name" => name_of(pod).to_string(),
        "metadata.namespace" => meta_str(pod, "namespace").to_string(),
        "metadata.uid" => uid_of(pod).to_string(),
        "spec.nodeName" => crate::pod::node_name(pod).to_string(),
        "spec.serviceAccountName" => pod
            .pointer("/spec/serviceAccountName")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        "status.podIP" | "status.hostIP" | "status.podIPs" | "status.hostIPs" => {
            "127.0.0.1".to_string()
        }
        _ => String::new(),
    }
}

fn missing(kind: &str, ns: &str, name: &str, key: Option<&str>) -> NotReady {
    NotReady {
        reason: "CreateContainerConfigError",
        message: match key {
            Some(k) => format!("couldn't find key {k} in {kind} {ns}/{name}"),
            None => format!("{} \"{name}\" not found", kind.to_lowercase()),
        },
    }
}

/// The container's process: environment (system vars, `envFrom`, `env` with `valueFrom` and
/// `$(VAR)` expansion), argv (`command` + `args`) and working directory, with every mounted
/// container path rewritten to its local directory.
pub(crate) fn prepare(
    cl: &Cluster,
    pod: &Value,
    container: &Value,
    dirs: &PodDirs,
    volumes: &HashMap<String, PathBuf>,
) -> Result<ProcSpec, NotReady> {
    let ns = meta_str(pod, "namespace");
    let mut map: Vec<(String, String)> = Vec::new();
    for m in container
        .get("volumeMounts")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
    {
        let mount = m
            .get("mountPath")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .trim_end_matches('/')
            .to_string();
        let vname = m.get("name").and_then(Value::as_str).unwrap_or_default();
        let Some(local) = volumes.get(vname) else {
            continue;
        };
        let mut local = local.clone();
        if let Some(sub) = m
            .get("subPath")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
        {
            local = local.join(sub);
            let _ = std::fs::create_dir_all(&local);
        }
        if !mount.is_empty() {
            map.push((mount, local.to_string_lossy().into_owned()));
        }
    }
    let rootfs = dirs.root.join("rootfs");
    let workdir = container
        .get("workingDir")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .trim_end_matches('/')
        .to_string();
    map.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
    let cwd = if workdir.is_empty() {
        rootfs.clone()
    } else {
        let mapped = rewrite_paths(&workdir, &map);
        if mapped != workdir {
            PathBuf::from(mapped)
        } else {
            let local = rootfs.join(workdir.trim_start_matches('/'));
            map.push((workdir.clone(), local.to_string_lossy().into_owned()));
            map.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
            local
        }
    };
    for d in [&cwd, &dirs.home()] {
        std::fs::create_dir_all(d).map_err(|e| NotReady {
            reason: "CreateContainerError",
            message: format!("creating {}: {e}", d.display()),
        })?;
    }
    let port = cl.settings.port.to_string();
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".into(),
            std::env::var("PATH").unwrap_or_else(|_| {
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
            }),
        ),
        ("HOME".into(), dirs.home().to_string_lossy().into_owned()),
        ("HOSTNAME".into(), name_of(pod).to_string()),
        ("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into()),
        ("KUBERNETES_SERVICE_PORT".into(), port.clone()),
        ("KUBERNETES_PORT".into(), format!("tcp://127.0.0.1:{port}")),
    ];
    fn set(env: &mut Vec<(String, String)>, k: String, v: String) {
        match env.iter_mut().find(|(ek, _)| *ek == k) {
            Some(e) => e.1 = v,
            None => env.push((k, v)),
        }
    }
    for from in container
        .get("envFrom")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
    {
        let prefix = from
            .get("prefix")
            .and_then(Value::as_str)
            .unwrap_or_default();
        for (key, secret) in [("secretRef", true), ("configMapRef", false)] {
            let Some(r) = from.get(key) else { continue };
            let name = r.get("name").and_then(Value::as_str).unwrap_or_default();
            match secret_or_cm(cl, secret, ns, name) {
                Some(data) => {
                    for (k, v) in data {
                        set(
                            &mut env,
                            format!("{prefix}{k}"),
                            String::from_utf8_lossy(&v).into_owned(),
                        );
                    }
                }
                None if r.get("optional").and_then(Value::as_bool).unwrap_or(false) => {}
                None => {
                    return Err(missing(
                        if secret { "Secret" } else { "ConfigMap" },
                        ns,
                        name,
                        None,
                    ))
                }
            }
        }
    }
    for e in container
        .get("env")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
    {
        let name = e
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let current: HashMap<String, String> = env.iter().cloned().collect();
        let value = if let Some(v) = e.get("value").and_then(Value::as_str) {
            expand(v, &current)
        } else if let Some(vf) = e.get("valueFrom") {
            if let Some(path) = vf.pointer("/fieldRef/fieldPath").and_then(Value::as_str) {
                field_ref(pod, path)
            } else if vf.get("resourceFieldRef").is_some() {
                "0".to_string()
            } else {
                let mut resolved = None;
                for (key, secret) in [("secretKeyRef", true), ("configMapKeyRef", false)] {
                    let Some(r) = vf.get(key) else { continue };
                    let oname = r.get("name").and_then(Value::as_str).unwrap_or_default();
                    let k = r.get("key").and_then(Value::as_str).unwrap_or_default();
                    let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
                    let kind = if secret { "Secret" } else { "ConfigMap" };
                    match secret_or_cm(cl, secret, ns, oname) {
                        Some(data) => match data.get(k) {
                            Some(v) => resolved = Some(String::from_utf8_lossy(v).into_owned()),
                            None if optional => {}
                            None => return Err(missing(kind, ns, oname, Some(k))),
                        },
                        None if optional => {}
                        None => return Err(missing(kind, ns, oname, None)),
                    }
                }
                match resolved {
                    Some(v) => v,
                    None => continue,
                }
            }
        } else {
            String::new()
        };
        set(&mut env, name, value);
    }
    let env: Vec<(String, String)> = env
        .into_iter()
        .map(|(k, v)| {
            let v = if k == "PATH" || k == "HOME" {
                v
            } else {
                rewrite_paths(&v, &map)
            };
            (k, v)
        })
        .collect();
    let lookup: HashMap<String, String> = env.iter().cloned().collect();
    let strs = |field: &str| -> Vec<String> {
        container
            .get(field)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(|s| rewrite_paths(&expand(s, &lookup), &map))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut argv = strs("command");
    argv.extend(strs("args"));
    Ok(ProcSpec { argv, env, cwd })
}

/// Signals a process group; a group that is already gone is fine.
/// Signals process group `pgid`; a non-positive id is ignored (killpg(0) would signal the
/// caller's own group).
pub(crate) fn signal_group(pgid: i32, sig: nix::sys::signal::Signal) {
    if pgid > 0 {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), sig);
    }
}

async fn pump<R: AsyncRead + Unpin>(r: R, log: Arc<LogBuffer>) {
    let mut reader = BufReader::new(r);
    loop {
        let mut line = Vec::new();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => log.push(line),
        }
    }
}

pub(crate) fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(9))
}

/// Starts a container process in its own process group and a task that waits for it, kills
/// what it left behind (a container's processes end with it), closes its log and records the
/// exit. Returns the process group id.
pub(crate) fn spawn(
    shared: Weak<Shared>,
    pod_uid: String,
    container: String,
    spec: &ProcSpec,
    log: Arc<LogBuffer>,
) -> std::io::Result<i32> {
    let (program, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty argv"))?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir(&spec.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    let pgid = child
        .id()
        .map(|p| p as i32)
        .ok_or_else(|| std::io::Error::other("process exited before it was observed"))?;
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    // Owned by the child process: it ends when the process does, and shutdown kills every
    // process group the kubelet started.
    tokio::spawn(async move {
        let out = async {
            if let Some(s) = stdout {
                pump(s, log.clone()).await;
            }
        };
        let err = async {
            if let Some(s) = stderr {
                pump(s, log.clone()).await;
            }
        };
        let wait = async {
            let status = child.wait().await;
            signal_group(pgid, nix::sys::signal::Signal::SIGKILL);
            status
        };
        let (status, (), ()) = tokio::join!(wait, out, err);
        let exit = Exit {
            code: status.map(exit_code).unwrap_or(128),
            finished_at: crate::store::now_rfc3339(),
            message: None,
        };
        log.close();
        if let Some(shared) = shared.upgrade() {
            shared
                .lock()
                .kubelet
                .record_exit(&pod_uid, &container, exit);
            shared.kick.notify_one();
        }
    });
    Ok(pgid)
}

pub(crate) fn pod_dirs(work_dir: &Path, pod: &Value) -> PodDirs {
    let uid = uid_of(pod);
    let short: String = uid.chars().take(8).collect();
    let node = crate::pod::node_name(pod);
    PodDirs {
        root: work_dir.join("pods").join(format!(
            "{}_{}_{short}",
            meta_str(pod, "namespace"),
            name_of(pod)
        )),
        node_root: work_dir
            .join("nodes")
            .join(if node.is_empty() { "unbound" } else { node }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_at_path_boundaries() {
        let map = vec![
            ("/app".to_string(), "/tmp/p/app".to_string()),
            ("/iris/outputs".to_string(), "/tmp/p/out".to_string()),
        ];
        assert_eq!(
            rewrite_paths("set -e; cd /app; ls /app/x \"/app\" /apple /x/app $IRIS_WORKDIR /iris/outputs/a", &map),
            "set -e; cd /tmp/p/app; ls /tmp/p/app/x \"/tmp/p/app\" /apple /x/app $IRIS_WORKDIR /tmp/p/out/a"
        );
        assert_eq!(rewrite_paths("/app", &map), "/tmp/p/app");
        assert_eq!(rewrite_paths("/app/.venv", &map), "/tmp/p/app/.venv");
        // A replacement is not rewritten again by a shorter mapping it happens to start with.
        let map = vec![
            (
                "/run/rigging/secrets".to_string(),
                "/tmp/p/secrets".to_string(),
            ),
            ("/tmp".to_string(), "/tmp/p/tmp".to_string()),
        ];
        assert_eq!(
            rewrite_paths("/run/rigging/secrets/TOKEN /tmp/x", &map),
            "/tmp/p/secrets/TOKEN /tmp/p/tmp/x"
        );
    }

    #[test]
    fn kubernetes_expansion() {
        let env: HashMap<String, String> = [("A".to_string(), "1".to_string())].into();
        assert_eq!(
            expand("x$(A)y $(B) $$(A) $HOME", &env),
            "x1y $(B) $(A) $HOME"
        );
    }
}
