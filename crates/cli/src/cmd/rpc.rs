//! `iris rpc controller|inspect <method>`: calls any `ControllerService` (or Iris's
//! `InspectService`) method with a JSON body over Connect's JSON encoding and pretty-prints the
//! JSON reply; exit 1 on a non-success status.

use crate::client::{controller_client, SVC};
use crate::keys;
use anyhow::Context;

pub(crate) async fn run(
    target: &str,
    method: &str,
    json: String,
    url: Option<String>,
) -> anyhow::Result<i32> {
    let cl = controller_client(&url)?;
    let m = kebab_to_pascal(method);
    let service = match target {
        "inspect" => iris_proto::INSPECT_SERVICE,
        _ => SVC,
    };
    let mut rb = reqwest::Client::new()
        .post(format!("{}/{service}/{m}", cl.base()))
        .header("content-type", "application/json")
        .body(json);
    if let Some(t) = keys::cli_token() {
        rb = rb.header("authorization", format!("Bearer {t}"));
    }
    let resp = rb.send().await.with_context(|| format!("calling {m}"))?;
    let ok = resp.status().is_success();
    let text = resp.text().await?;
    let pretty = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or(text);
    println!("{pretty}");
    Ok(if ok { 0 } else { 1 })
}

fn kebab_to_pascal(s: &str) -> String {
    if !s.contains('-')
        && s.chars()
            .next()
            .map(|c| c.is_ascii_uppercase())
            .unwrap_or(false)
    {
        return s.to_string();
    }
    s.split(['-', '_'])
        .map(|p| {
            let mut c = p.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}
