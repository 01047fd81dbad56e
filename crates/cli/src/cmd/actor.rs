//! `iris actor call ENDPOINT METHOD [KWARGS]`: calls a method of an actor served by a task (the
//! Python `ActorServer`) through the controller's `/proxy/<name>/` path, as the published CLI
//! does. Arguments and results are pickled Python values: the JSON kwargs are pickled as a dict
//! (positional arguments an empty tuple), and the pickled result is printed as JSON.

use crate::client::controller_client;
use crate::cmd::rpc::wire::{self, Target};
use crate::keys;
use anyhow::{bail, Context as _};
use iris_proto::iris::actor::{actor_response, ActorCall, ActorResponse};
use iris_rpc::{Code, RpcError};
use prost::Message as _;
use serde_json::Value;
use serde_pickle::{HashableValue, Value as Py};
use std::time::{Duration, Instant};

#[derive(clap::Subcommand)]
pub(crate) enum ActorCmd {
    /// Call an actor method through the controller proxy.
    ///
    /// ENDPOINT is the actor's name in the endpoint registry (`iris endpoints list`); the call
    /// goes to the controller's `/proxy/<name>/`. Prints the return value as JSON; an exception
    /// the method raises exits 1 with its type and message.
    Call {
        /// The actor's full endpoint name, e.g. /alice/train/coordinator/actor-0.
        endpoint: String,
        /// The method to call, e.g. get_counters.
        method: String,
        /// Keyword arguments as a JSON object, e.g. '{"worker_id": "w-3"}'.
        kwargs: Option<String>,
        /// Per-call timeout in seconds.
        #[arg(long, default_value_t = 30.0)]
        timeout: f64,
    },
}

/// Attempts while the actor is unreachable (the proxy answers `unavailable` until the task's
/// server is up), with backoff from 0.5 s doubling to 10 s, as the published client retries.
const MAX_ATTEMPTS: u32 = 10;

pub(crate) async fn run(cmd: ActorCmd, url: Option<String>) -> anyhow::Result<i32> {
    let ActorCmd::Call {
        endpoint,
        method,
        kwargs,
        timeout,
    } = cmd;
    if !(timeout.is_finite() && timeout > 0.0) {
        bail!("--timeout must be a positive number of seconds, not {timeout}");
    }
    let timeout = Duration::from_secs_f64(timeout);
    let call = ActorCall {
        method_name: method.clone(),
        actor_name: endpoint.clone(),
        serialized_args: pickle_args()?,
        serialized_kwargs: pickle_kwargs(kwargs.as_deref())?,
    };
    let base = controller_client(&url)?.base().to_string();
    let target = Target::new(&proxy_url(&base, &endpoint), keys::cli_token());
    let body = call.encode_to_vec();
    let started = Instant::now();
    let mut backoff = Duration::from_millis(500);
    let mut attempt = 1;
    let bytes = loop {
        match wire::unary(
            &target,
            iris_proto::ACTOR_SERVICE,
            "Call",
            body.clone(),
            timeout,
        )
        .await
        {
            Ok(b) => break b,
            Err(e)
                if e.code == Code::Unavailable
                    && attempt < MAX_ATTEMPTS
                    && started.elapsed() + backoff < timeout =>
            {
                tracing::info!(attempt, error = %e, "actor unavailable; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
                attempt += 1;
            }
            Err(e) => return Err(anyhow::Error::new(e)),
        }
    };
    let reply = ActorResponse::decode(bytes.as_slice()).map_err(|e| {
        RpcError::internal(format!("the actor's reply is not an ActorResponse: {e}"))
    })?;
    match reply.result {
        Some(actor_response::Result::SerializedValue(v)) => {
            println!("{}", render_result(&v)?);
            Ok(0)
        }
        Some(actor_response::Result::Error(err)) => {
            eprintln!(
                "error: {endpoint}.{method} raised {}: {}",
                err.error_type, err.message
            );
            Ok(1)
        }
        None => bail!("the actor's reply to {method} carries neither a value nor an error"),
    }
}

/// `<controller>/proxy/<name>`: the name without its leading slash and with dots for slashes,
/// as the controller's proxy expects it.
fn proxy_url(controller: &str, endpoint: &str) -> String {
    let encoded = endpoint.trim_start_matches('/').replace('/', ".");
    format!("{}/proxy/{encoded}", controller.trim_end_matches('/'))
}

/// The positional arguments: always none (an empty tuple).
fn pickle_args() -> anyhow::Result<Vec<u8>> {
    serde_pickle::value_to_vec(&Py::Tuple(Vec::new()), serde_pickle::SerOptions::new())
        .context("pickling the arguments")
}

/// KWARGS (a JSON object, `{}` when absent) as a pickled dict of str to value.
fn pickle_kwargs(kwargs: Option<&str>) -> anyhow::Result<Vec<u8>> {
    let map = match kwargs {
        None => serde_json::Map::new(),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => m,
            Ok(_) => {
                bail!("KWARGS must be a JSON object of keyword arguments, e.g. '{{\"a\": 1}}'")
            }
            Err(e) => {
                bail!("KWARGS is not valid JSON ({e}); pass an object such as '{{\"a\": 1}}'")
            }
        },
    };
    serde_pickle::to_vec(&map, serde_pickle::SerOptions::new()).context("pickling KWARGS")
}

/// The pickled return value as pretty JSON (what `json.dumps(value, indent=2, default=str)`
/// prints for plain values).
fn render_result(pickled: &[u8]) -> anyhow::Result<String> {
    let value =
        serde_pickle::value_from_slice(pickled, serde_pickle::DeOptions::new()).map_err(|e| {
            anyhow::anyhow!(
                "the actor returned a value this CLI cannot read ({e}); only plain Python values \
                 (None, bool, int, float, str, bytes, list, tuple, set, dict) can be shown"
            )
        })?;
    serde_json::to_string_pretty(&to_json(value)).context("rendering the result as JSON")
}

/// Python value → JSON the way `json.dumps(default=str)` maps it: tuples become arrays, dict
/// keys strings, and what JSON cannot hold (bytes, sets) the value's `str()`.
fn to_json(v: Py) -> Value {
    match v {
        Py::None => Value::Null,
        Py::Bool(b) => Value::Bool(b),
        Py::I64(i) => Value::from(i),
        Py::Int(big) => big_int(&big.to_string()),
        Py::F64(f) => serde_json::Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(py_float(f))),
        Py::String(s) => Value::String(s),
        Py::Bytes(b) => Value::String(py_bytes(&b)),
        Py::List(items) | Py::Tuple(items) => {
            Value::Array(items.into_iter().map(to_json).collect())
        }
        Py::Set(items) => Value::String(py_set("", &items)),
        Py::FrozenSet(items) => Value::String(py_set("frozenset", &items)),
        Py::Dict(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (dict_key(&k), to_json(v)))
                .collect(),
        ),
    }
}

/// An int beyond 64 bits stays exact, as a string of its digits.
fn big_int(digits: &str) -> Value {
    digits
        .parse::<i64>()
        .map(Value::from)
        .or_else(|_| digits.parse::<u64>().map(Value::from))
        .unwrap_or_else(|_| Value::String(digits.to_string()))
}

/// A dict key as `json.dumps` writes it (str as is; None, bools and numbers by their JSON
/// spelling; anything else, which Python would refuse, by its repr).
fn dict_key(k: &HashableValue) -> String {
    match k {
        HashableValue::String(s) => s.clone(),
        HashableValue::None => "null".into(),
        HashableValue::Bool(b) => b.to_string(),
        HashableValue::I64(i) => i.to_string(),
        HashableValue::Int(big) => big.to_string(),
        HashableValue::F64(f) => py_float(*f),
        other => py_repr(other),
    }
}

/// Python's `repr()` of a hashable value (for set elements and odd dict keys).
fn py_repr(v: &HashableValue) -> String {
    match v {
        HashableValue::None => "None".into(),
        HashableValue::Bool(true) => "True".into(),
        HashableValue::Bool(false) => "False".into(),
        HashableValue::I64(i) => i.to_string(),
        HashableValue::Int(big) => big.to_string(),
        HashableValue::F64(f) => py_float(*f),
        HashableValue::Bytes(b) => py_bytes(b),
        HashableValue::String(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        HashableValue::Tuple(items) if items.len() == 1 => format!("({},)", py_repr(&items[0])),
        HashableValue::Tuple(items) => {
            let parts: Vec<String> = items.iter().map(py_repr).collect();
            format!("({})", parts.join(", "))
        }
        HashableValue::FrozenSet(items) => py_set("frozenset", items),
    }
}

/// `str()` of a set (`{1, 2}`, `set()`) or frozenset (`frozenset({1})`).
fn py_set<'a>(kind: &str, items: impl IntoIterator<Item = &'a HashableValue>) -> String {
    let parts: Vec<String> = items.into_iter().map(py_repr).collect();
    match (kind, parts.is_empty()) {
        ("", true) => "set()".into(),
        ("", false) => format!("{{{}}}", parts.join(", ")),
        (k, true) => format!("{k}()"),
        (k, false) => format!("{k}({{{}}})", parts.join(", ")),
    }
}

fn py_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        // debug-ok: f64's Debug is its shortest round-trip form, as Python's repr prints it.
        format!("{f:?}")
    }
}

/// `str()` of bytes: `b'...'` with printable ASCII as is and the rest escaped.
fn py_bytes(b: &[u8]) -> String {
    let mut out = String::from("b'");
    for &c in b {
        match c {
            b'\\' => out.push_str("\\\\"),
            b'\'' => out.push_str("\\'"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x20..=0x7e => out.push(char::from(c)),
            _ => out.push_str(&format!("\\x{c:02x}")),
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_url_encodes_the_name_with_dots() {
        assert_eq!(
            proxy_url("http://h:1/", "/alice/job/calc"),
            "http://h:1/proxy/alice.job.calc"
        );
    }

    #[test]
    fn kwargs_pickle_as_a_dict_and_round_trip() {
        let bytes =
            pickle_kwargs(Some(r#"{"a": 2, "b": [1, "x", null, true, 1.5]}"#)).expect("pickles");
        let back =
            serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new()).expect("reads");
        let Py::Dict(map) = back else {
            panic!("not a dict: {back:?}")
        };
        assert_eq!(
            map.get(&HashableValue::String("a".into())),
            Some(&Py::I64(2))
        );
        assert_eq!(
            map.get(&HashableValue::String("b".into())),
            Some(&Py::List(vec![
                Py::I64(1),
                Py::String("x".into()),
                Py::None,
                Py::Bool(true),
                Py::F64(1.5)
            ]))
        );
        let empty = pickle_kwargs(None).expect("pickles");
        assert_eq!(
            serde_pickle::value_from_slice(&empty, serde_pickle::DeOptions::new()).expect("reads"),
            Py::Dict(Default::default())
        );
        let args = pickle_args().expect("pickles");
        assert_eq!(
            serde_pickle::value_from_slice(&args, serde_pickle::DeOptions::new()).expect("reads"),
            Py::Tuple(vec![])
        );
        assert!(pickle_kwargs(Some("[1]")).is_err());
        assert!(pickle_kwargs(Some("{")).is_err());
    }

    #[test]
    fn a_protocol_5_pickle_renders_like_json_dumps() {
        // cloudpickle.dumps({"sum": 42, "t": (1, b"a\x00"), "s": {3}, 7: None, "big": 2**70}).
        let pickled: &[u8] = b"\x80\x05\x958\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x03sum\x94K*\x8c\x01t\x94K\x01C\x02a\x00\x94\x86\x94\x8c\x01s\x94\x8f\x94(K\x03\x90K\x07N\x8c\x03big\x94\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00@u.";
        let text = render_result(pickled).expect("renders");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(
            v,
            serde_json::json!({
                "sum": 42, "t": [1, "b'a\\x00'"], "s": "{3}", "7": null, "big": "1180591620717411303424"
            })
        );
        assert!(text.starts_with("{\n  \""), "{text}");
    }
}
