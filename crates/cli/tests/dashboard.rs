//! The web dashboard in a real headless browser: Debian's `chromium`, driven over WebDriver
//! (`chromedriver` + `fantoccini`), against a real controller (`--dashboard-bind`) and a worker
//! advertising 8 fake H100s, with jobs submitted through the `iris` CLI.
//!
//! Needs `/usr/bin/chromium` and `/usr/bin/chromedriver`
//! (`bash crates/dashboard/ci/install-browser.sh`). `IRIS_SKIP_BROWSER_TESTS=1` skips it.
//! Screenshots of every page land in `target/dashboard-screenshots/`.

mod common;

use common::{TestCluster, WorkerSpec, STARTUP};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How long the browser may take to show an expected state (the machine may be busy).
const PATIENCE: Duration = Duration::from_secs(60);

struct Driver {
    child: Child,
    url: String,
    profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn start_driver() -> Driver {
    let port = free_port();
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let d = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
        profile: tempfile::Builder::new()
            .prefix("iris-chromium-")
            .tempdir()
            .expect("profile dir"),
    };
    common::wait_until(STARTUP, "chromedriver to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    d
}

async fn browser(d: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": CHROMIUM,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,800",
                format!("--user-data-dir={}", d.profile.path().display()),
            ],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&d.url)
        .await
        .expect("start a chromium session")
}

fn shots_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/dashboard-screenshots");
    std::fs::create_dir_all(&d).expect("screenshot dir");
    d
}

async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("screenshot");
    std::fs::write(shots_dir().join(format!("{name}.png")), png).expect("write screenshot");
}

/// Polls `js` (a function body returning a value) until it returns something truthy.
async fn wait_js(c: &Client, what: &str, js: &str) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let last = match c.execute(js, vec![]).await {
            Ok(v) if !matches!(v, Value::Null | Value::Bool(false)) && v != json!("") => return v,
            Ok(v) => v,
            Err(e) => json!(e.to_string()),
        };
        if Instant::now() >= deadline {
            let url = c
                .current_url()
                .await
                .map(|u| u.to_string())
                .unwrap_or_default();
            let text = main_text(c).await;
            panic!("timed out waiting for {what} on {url}; last value {last}\npage text:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn main_text(c: &Client) -> String {
    match c.find(Locator::Css("main")).await {
        Ok(e) => e.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// The server's bytes for a dashboard path.
async fn page_bytes(base: &str, path: &str) -> usize {
    let r = reqwest::get(format!("{base}{path}"))
        .await
        .expect("GET page");
    r.bytes().await.expect("page body").len()
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_a_real_browser() {
    if std::env::var_os("IRIS_SKIP_BROWSER_TESTS").is_some() {
        eprintln!("IRIS_SKIP_BROWSER_TESTS is set: skipping the browser test");
        return;
    }
    assert!(
        Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists(),
        "the dashboard browser test needs Debian's chromium and chromium-driver: \
         run `bash crates/dashboard/ci/install-browser.sh` (or set IRIS_SKIP_BROWSER_TESTS=1)"
    );
    let tc = blocking(|| {
        TestCluster::start_with_args(
            &[WorkerSpec::cpu(4).device("gpu:h100:8")],
            None,
            &["--dashboard-bind", "127.0.0.1:0"],
        )
    });
    let base = tc.dashboard_url();
    assert!(base.starts_with("http://127.0.0.1:"), "{base}");

    // Jobs through the CLI: one succeeds, one fails, one prints 5,000 lines, one keeps running.
    let (ok, bad, chatty, sleeper) = blocking(|| {
        let ok = tc.submit(
            "ok",
            &[],
            &["sh", "-c", "echo hello from the dashboard test"],
        );
        let bad = tc.submit("bad", &[], &["sh", "-c", "echo about to fail >&2; exit 3"]);
        let chatty = tc.submit(
            "chatty",
            &[],
            &[
                "sh",
                "-c",
                "echo 'rank0 step 1 train/loss=2.345'; seq 1 4999 | sed 's/^/rank1 filler line /'",
            ],
        );
        let sleeper = tc.submit("sleeper", &[], &["sleep", "300"]);
        tc.wait_job(&ok, "succeeded");
        tc.wait_job(&bad, "failed");
        tc.wait_job(&chatty, "succeeded");
        tc.wait_job(&sleeper, "running");
        (ok, bad, chatty, sleeper)
    });

    let d = blocking(start_driver);
    let c = browser(&d).await;

    // Jobs page: every job with its state, as text.
    c.goto(&format!("{base}/jobs")).await.expect("open jobs");
    let expect = [
        (&ok, "succeeded"),
        (&bad, "failed"),
        (&chatty, "succeeded"),
        (&sleeper, "running"),
    ];
    for (id, state) in expect {
        wait_js(
            &c,
            &format!("{id} to be listed as {state}"),
            &format!(
                "return Array.from(document.querySelectorAll('table.jobs tbody tr')).some(r => \
                 r.cells[0].innerText.trim() === {id:?} && r.cells[1].innerText.trim() === {state:?});"
            ),
        )
        .await;
    }
    shot(&c, "01-jobs").await;
    // Keyboard: the first Tab lands on the skip link, which leads to the content.
    c.find(Locator::Css("body"))
        .await
        .expect("body")
        .send_keys("\u{E004}")
        .await
        .expect("tab");
    wait_js(
        &c,
        "the skip link to take focus",
        "return document.activeElement && document.activeElement.classList.contains('skip');",
    )
    .await;

    // Click through: job → task → logs.
    c.find(Locator::LinkText(&chatty))
        .await
        .expect("job link")
        .click()
        .await
        .expect("click job");
    wait_js(
        &c,
        "the job page",
        "return document.querySelector('h1').innerText.startsWith('Job ');",
    )
    .await;
    wait_js(
        &c,
        "the attempt timeline",
        "return !!document.querySelector('svg.timeline');",
    )
    .await;
    shot(&c, "02-job").await;
    c.find(Locator::LinkText("task 0"))
        .await
        .expect("task link")
        .click()
        .await
        .expect("click task");
    wait_js(
        &c,
        "the task page",
        "return document.querySelector('h1').innerText.startsWith('Task ');",
    )
    .await;
    wait_js(
        &c,
        "task events",
        "return document.querySelector('main').innerText.includes('Events');",
    )
    .await;
    shot(&c, "03-task").await;
    c.find(Locator::LinkText("Full logs (tail, follow, filter)"))
        .await
        .expect("logs link")
        .click()
        .await
        .expect("click logs");
    wait_js(
        &c,
        "the logs page",
        "return document.querySelectorAll('#log-lines li').length === 1000;",
    )
    .await;
    let tail = c
        .find(Locator::Css("#log-lines"))
        .await
        .expect("lines")
        .text()
        .await
        .expect("text");
    assert!(
        tail.contains("rank1 filler line 4999"),
        "the tail shows the last line"
    );
    assert!(
        !tail.contains("train/loss"),
        "the early line is outside the loaded tail"
    );

    // The find box searches only the loaded lines: the early line is not among them.
    c.find(Locator::Css("#find"))
        .await
        .expect("find box")
        .send_keys("train/loss")
        .await
        .expect("type");
    let n = wait_js(
        &c,
        "find to count",
        "return document.getElementById('find-count').innerText;",
    )
    .await;
    assert_eq!(n, json!("0 of 1000 loaded line(s) match"));
    shot(&c, "04-logs-find").await;

    // The full-log filter runs on the server over the whole log and finds it.
    c.find(Locator::Css("#regex"))
        .await
        .expect("regex")
        .send_keys("rank0.*train/loss")
        .await
        .expect("type");
    c.find(Locator::Css("form.filters button[type=submit]"))
        .await
        .expect("filter")
        .click()
        .await
        .expect("submit");
    wait_js(
        &c,
        "the regex filter to find the early line",
        "const l = document.getElementById('log-lines'); return l && l.innerText.includes('rank0 step 1 train/loss=2.345') && l.children.length === 1;",
    )
    .await;
    shot(&c, "05-logs-regex").await;

    // An unbalanced `[` is refused with a visible error, not an empty result.
    let re = c.find(Locator::Css("#regex")).await.expect("regex");
    re.clear().await.expect("clear");
    re.send_keys("[").await.expect("type");
    c.find(Locator::Css("form.filters button[type=submit]"))
        .await
        .expect("filter")
        .click()
        .await
        .expect("submit");
    let err = wait_js(
        &c,
        "the bad-regex error",
        "const e = document.querySelector('.error[role=alert]'); return e && e.innerText;",
    )
    .await;
    assert!(err.as_str().unwrap_or("").contains("rejected"), "{err}");
    shot(&c, "06-logs-bad-regex").await;

    // A failed task's page shows its exit code and error.
    c.goto(&format!("{base}/task{bad}/0"))
        .await
        .expect("failed task");
    wait_js(
        &c,
        "the failed task",
        "return document.getElementById('task-state').innerText.trim() === 'failed';",
    )
    .await;
    shot(&c, "07-task-failed").await;

    // A cancelled job turns KILLED on the open page, without a reload.
    c.goto(&format!("{base}/job{sleeper}"))
        .await
        .expect("sleeper page");
    wait_js(
        &c,
        "the running job",
        "return document.getElementById('job-state').innerText.trim() === 'running';",
    )
    .await;
    c.execute("window.__irisNoReload = 'still here'; return 1;", vec![])
        .await
        .expect("marker");
    blocking(|| tc.iris(&["job", "cancel", &sleeper]).ok().to_string());
    wait_js(
        &c,
        "the job to turn killed without a reload",
        "return window.__irisNoReload === 'still here' && document.getElementById('job-state').innerText.trim() === 'killed';",
    )
    .await;
    shot(&c, "08-job-killed").await;

    // Backends: 8/8 H100 free while idle, 0/8 while a job holds them (live, no reload).
    c.goto(&format!("{base}/backends")).await.expect("backends");
    let h100_row = "const r = Array.from(document.querySelectorAll('table.backends tbody tr')).find(r => r.cells[0].innerText.includes('H100')); return r ? r.innerText : '';";
    let row = wait_js(&c, "an H100 row", h100_row).await;
    assert!(
        row.as_str().unwrap_or("").contains("8/8 free"),
        "idle: {row}"
    );
    shot(&c, "09-backends-idle").await;
    c.execute("window.__irisNoReload = 'backends'; return 1;", vec![])
        .await
        .expect("marker");
    let (gpu, queued) = blocking(|| {
        let gpu = tc.submit(
            "gpu",
            &["--enable-extra-resources", "--gpu", "H100x8"],
            &["sleep", "300"],
        );
        tc.wait_job(&gpu, "running");
        let queued = tc.submit(
            "gpu-queued",
            &["--enable-extra-resources", "--gpu", "H100x8"],
            &["sleep", "300"],
        );
        (gpu, queued)
    });
    wait_js(
        &c,
        "the H100s to be held",
        "const r = Array.from(document.querySelectorAll('table.backends tbody tr')).find(r => r.cells[0].innerText.includes('H100')); \
         return window.__irisNoReload === 'backends' && r && r.innerText.includes('0/8 free');",
    )
    .await;
    shot(&c, "10-backends-held").await;

    // The remaining pages.
    c.goto(&format!("{base}/scheduler"))
        .await
        .expect("scheduler");
    wait_js(
        &c,
        "the queued job with a reason",
        &format!("return document.querySelector('main').innerText.includes({queued:?});"),
    )
    .await;
    shot(&c, "11-scheduler").await;
    c.goto(&format!("{base}/workers")).await.expect("workers");
    wait_js(
        &c,
        "the worker",
        "return document.querySelector('main').innerText.includes('healthy');",
    )
    .await;
    shot(&c, "12-workers").await;
    c.goto(&format!(
        "{base}/query?sql=SELECT+state%2C+count(*)+AS+n+FROM+jobs+GROUP+BY+state"
    ))
    .await
    .expect("query");
    wait_js(
        &c,
        "query rows",
        "return document.querySelectorAll('table.query tbody tr').length > 0;",
    )
    .await;
    shot(&c, "13-query").await;
    c.goto(&format!("{base}/jobs")).await.expect("jobs again");
    wait_js(
        &c,
        "the jobs table",
        "return document.querySelectorAll('table.jobs tbody tr').length >= 6;",
    )
    .await;
    shot(&c, "14-jobs-after").await;
    c.set_window_size(420, 900).await.expect("narrow window");
    c.goto(&format!("{base}/jobs")).await.expect("jobs narrow");
    wait_js(
        &c,
        "the jobs table",
        "return document.querySelectorAll('table.jobs tbody tr').length >= 6;",
    )
    .await;
    shot(&c, "15-jobs-narrow").await;
    c.goto(&format!("{base}/job{gpu}"))
        .await
        .expect("job narrow");
    wait_js(
        &c,
        "the job page",
        "return !!document.getElementById('job-state');",
    )
    .await;
    shot(&c, "16-job-narrow").await;

    // Every page is small.
    for p in [
        "/jobs".to_string(),
        format!("/job{chatty}"),
        format!("/task{chatty}/0"),
        format!("/logs{chatty}/0"),
        format!("/logs{chatty}"),
        "/workers".into(),
        "/backends".into(),
        "/scheduler".into(),
        "/query?sql=SELECT+*+FROM+jobs".into(),
    ] {
        let n = page_bytes(&base, &p).await;
        assert!(n < 200_000, "{p} is {n} bytes");
    }

    c.close().await.expect("close browser");
    blocking(|| {
        tc.iris(&["job", "cancel", &gpu, &queued]).ok();
    });
}
