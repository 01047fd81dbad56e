//! Reaching a remote controller as the published CLI does, through a tunnel held open for the
//! life of the command, which then talks to `http://127.0.0.1:<local>`: inside a Kubernetes
//! cluster (`controller: coreweave`), `kubectl port-forward svc/<service> <local>:<port>` in the
//! config's namespace; on a GCP VM (`controller: gcp`), `gcloud compute ssh` with `-L` to the VM
//! labelled as the cluster's controller.
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

/// An SSH tunnel to a GCP controller VM, as the published CLI opens one: the VM is the running
/// instance labelled `iris-<label_prefix>-controller=true` in the project, and
/// `gcloud compute ssh VM --project P --zone Z -- -L 127.0.0.1:LOCAL:localhost:PORT -N ...`
/// forwards to the controller's port on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcpSsh {
    pub project: String,
    pub label_prefix: String,
    pub port: u16,
    /// `defaults.ssh.impersonate_service_account`.
    pub impersonate: Option<String>,
    /// `defaults.ssh.key_file`; gcloud's own key (`~/.ssh/google_compute_engine`) otherwise.
    pub key_file: Option<String>,
}

/// A controller VM found by its label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vm {
    pub name: String,
    pub zone: String,
}

impl GcpSsh {
    fn label(&self) -> String {
        format!("iris-{}-controller", self.label_prefix)
    }

    /// `gcloud compute instances list` arguments that find the controller VM.
    pub fn list_args(&self) -> Vec<String> {
        vec![
            "compute".into(),
            "instances".into(),
            "list".into(),
            format!("--project={}", self.project),
            format!("--filter=labels.{}=true AND status=RUNNING", self.label()),
            "--format=json(name,zone,status)".into(),
        ]
    }

    /// gcloud's arguments for forwarding `local` to the controller on `vm`.
    pub fn ssh_args(&self, vm: &Vm, local: u16) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "compute".into(),
            "ssh".into(),
            vm.name.clone(),
            format!("--project={}", self.project),
            format!("--zone={}", vm.zone),
        ];
        if let Some(sa) = &self.impersonate {
            a.push(format!("--impersonate-service-account={sa}"));
        }
        if let Some(k) = &self.key_file {
            a.push(format!("--ssh-key-file={k}"));
        }
        a.extend(["--".into(), "-L".into()]);
        a.push(format!("127.0.0.1:{local}:localhost:{}", self.port));
        a.push("-N".into());
        for o in [
            "BatchMode=yes",
            "StrictHostKeyChecking=no",
            "UserKnownHostsFile=/dev/null",
            "LogLevel=ERROR",
            "ServerAliveInterval=60",
            "ServerAliveCountMax=3",
        ] {
            a.extend(["-o".into(), o.into()]);
        }
        a
    }
}

/// The first running VM in `gcloud compute instances list --format=json` output; `zone` may be
/// a URL (`.../zones/us-central1-a`).
pub fn parse_vms(json: &str) -> anyhow::Result<Option<Vm>> {
    let v: serde_json::Value = serde_json::from_str(json)
        .context("reading `gcloud compute instances list` output as JSON")?;
    let vm = v.as_array().into_iter().flatten().find_map(|i| {
        let running = i["status"].as_str().is_none_or(|s| s == "RUNNING");
        let name = i["name"].as_str()?;
        let zone = i["zone"].as_str()?.rsplit('/').next()?;
        running.then(|| Vm {
            name: name.to_string(),
            zone: zone.to_string(),
        })
    });
    Ok(vm)
}

fn gcloud() -> String {
    std::env::var("IRIS_GCLOUD").unwrap_or_else(|_| "gcloud".into())
}

/// Finds the controller VM and opens the SSH tunnel to it; the controller's local URL.
pub fn open_gcp(t: &GcpSsh, within: Duration) -> anyhow::Result<String> {
    // Without a key gcloud offers to make one and waits at a prompt nobody sees.
    let key = match &t.key_file {
        Some(k) => std::path::PathBuf::from(k),
        None => std::env::var_os("HOME")
            .map(std::path::PathBuf::from)
            .unwrap_or_default()
            .join(".ssh/google_compute_engine"),
    };
    if !key.is_file() {
        bail!(
            "no SSH key at {}: `gcloud compute ssh` needs one to reach the controller VM; make it with \
             `ssh-keygen -t rsa -f ~/.ssh/google_compute_engine -N ''` (or set defaults.ssh.key_file)",
            key.display()
        );
    }
    let gcloud = gcloud();
    let out = Command::new(&gcloud)
        .args(t.list_args())
        .stdin(Stdio::null())
        .output()
        .with_context(|| {
            format!("running `{gcloud} compute instances list` to find the controller VM; install the Google Cloud CLI, or open a tunnel yourself and pass --controller-url")
        })?;
    if !out.status.success() {
        bail!(
            "`gcloud compute instances list` in project {} failed ({}): {}",
            t.project,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let vm = parse_vms(&String::from_utf8_lossy(&out.stdout))?.with_context(|| {
        format!(
            "no running controller VM in project {} (label {}=true); start the cluster with `iris cluster start`",
            t.project,
            t.label()
        )
    })?;
    let local = free_port()?;
    let what = format!("`gcloud compute ssh {}` (zone {})", vm.name, vm.zone);
    spawn_and_wait(&gcloud, &t.ssh_args(&vm, local), local, &what, within)
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
    let what = format!(
        "`kubectl port-forward svc/{}` in namespace {}",
        pf.service, pf.namespace
    );
    spawn_and_wait(&kubectl, &pf.args(local), local, &what, within)
}

/// Starts `program args` and waits (at most `within`) until 127.0.0.1:`local` accepts
/// connections; `what` names the tunnel in errors.
fn spawn_and_wait(
    program: &str,
    args: &[String],
    local: u16,
    what: &str,
    within: Duration,
) -> anyhow::Result<String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| {
            format!(
                "starting {what} to reach the controller; install `{program}`, or open a tunnel yourself and pass --controller-url"
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
                "{what} exited ({status}) before the tunnel was up: {}",
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
                "{what} did not open 127.0.0.1:{local} within {}s",
                within.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    tracing::info!(local, tunnel = %what, "tunnel ready");
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

    #[test]
    fn gcp_tunnel_finds_the_labelled_vm_and_forwards_its_port() {
        let t = GcpSsh {
            project: "proj".into(),
            label_prefix: "marin".into(),
            port: 10000,
            impersonate: Some("sa@proj.iam.gserviceaccount.com".into()),
            key_file: None,
        };
        assert!(t.list_args().contains(
            &"--filter=labels.iris-marin-controller=true AND status=RUNNING".to_string()
        ));
        let json = r#"[{"name":"old","zone":"z","status":"TERMINATED"},
            {"name":"iris-controller-marin","status":"RUNNING",
             "zone":"https://www.googleapis.com/compute/v1/projects/proj/zones/us-central1-a"}]"#;
        let vm = parse_vms(json).expect("json").expect("a running VM");
        assert_eq!(vm.name, "iris-controller-marin");
        assert_eq!(vm.zone, "us-central1-a");
        let a = t.ssh_args(&vm, 4000).join(" ");
        assert!(
            a.starts_with("compute ssh iris-controller-marin --project=proj --zone=us-central1-a --impersonate-service-account=sa@proj.iam.gserviceaccount.com -- -L 127.0.0.1:4000:localhost:10000 -N -o BatchMode=yes"),
            "{a}"
        );
        assert_eq!(parse_vms("[]").expect("json"), None);
        assert!(parse_vms("not json").is_err());
    }
}
