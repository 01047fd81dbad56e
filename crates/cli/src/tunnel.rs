//! Reaching a controller that runs inside a Kubernetes cluster (`controller: coreweave`), as
//! the published CLI does: `kubectl port-forward svc/<service> <local>:<port>` in the config's
//! namespace, held open for the life of the command, and the command talks to
//! `http://127.0.0.1:<local>`.
//!
//! The kubectl child stays in the CLI's process group, so a Ctrl-C reaches it too; the CLI
//! stops it explicitly before it exits ([`close`]), since `std::process::exit` runs no
//! destructors.

use anyhow::{bail, Context};
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static OPEN: Mutex<Vec<Child>> = Mutex::new(Vec::new());

/// Where a port-forward goes: `kubectl [--kubeconfig K] [--context C] -n NS port-forward
/// svc/SERVICE LOCAL:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortForward {
    pub kubeconfig: Option<String>,
    pub context: Option<String>,
    pub namespace: String,
    pub service: String,
    pub port: u16,
}

impl PortForward {
    /// kubectl's arguments for forwarding `local`.
    pub fn args(&self, local: u16) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(k) = &self.kubeconfig {
            a.extend(["--kubeconfig".to_string(), k.clone()]);
        }
        if let Some(c) = &self.context {
            a.extend(["--context".to_string(), c.clone()]);
        }
        a.extend([
            "-n".to_string(),
            self.namespace.clone(),
            "port-forward".to_string(),
            format!("svc/{}", self.service),
            format!("{local}:{}", self.port),
        ]);
        a
    }
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free local port")?;
    Ok(l.local_addr()?.port())
}

/// Opens the port-forward and waits (at most `within`) until its local end accepts
/// connections; the controller's local URL.
pub fn open(pf: &PortForward, within: Duration) -> anyhow::Result<String> {
    let local = free_port()?;
    let kubectl = std::env::var("IRIS_KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let mut child = Command::new(&kubectl)
        .args(pf.args(local))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| {
            format!(
                "starting `{kubectl} port-forward` to reach the controller (svc/{} in namespace {}); install kubectl, or open a tunnel yourself and pass --controller-url",
                pf.service, pf.namespace
            )
        })?;
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            bail!(
                "`kubectl port-forward svc/{}` in namespace {} exited ({status}) before the tunnel was up: {}",
                pf.service,
                pf.namespace,
                err.trim()
            );
        }
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], local));
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
            break;
        }
        if start.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "`kubectl port-forward svc/{}` in namespace {} did not open 127.0.0.1:{local} within {}s",
                pf.service,
                pf.namespace,
                within.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    tracing::info!(local, service = %pf.service, "tunnel ready");
    if let Ok(mut open) = OPEN.lock() {
        open.push(child);
    }
    Ok(format!("http://127.0.0.1:{local}"))
}

/// Stops every tunnel this process opened.
pub fn close() {
    let children = match OPEN.lock() {
        Ok(mut open) => std::mem::take(&mut *open),
        Err(_) => return,
    };
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_forward_arguments_name_the_namespace_service_and_ports() {
        let pf = PortForward {
            kubeconfig: Some("/k".into()),
            context: None,
            namespace: "iris".into(),
            service: "iris-controller-svc".into(),
            port: 10000,
        };
        assert_eq!(
            pf.args(4000).join(" "),
            "--kubeconfig /k -n iris port-forward svc/iris-controller-svc 4000:10000"
        );
    }
}
