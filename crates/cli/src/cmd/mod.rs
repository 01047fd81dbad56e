//! The implementations of `iris` subcommands, one module per command group (`iris job ...` in
//! [`job`], `iris task ...` in [`task`], and so on). The clap definitions and the top-level
//! dispatch stay in `main.rs`; helpers shared by several groups (log fetching, bulk id
//! arguments) live here and in [`logs`].

pub(crate) mod actor;
pub(crate) mod attempt;
pub(crate) mod cluster;
pub(crate) mod endpoints;
pub(crate) mod job;
pub(crate) mod logs;
pub(crate) mod process;
pub(crate) mod query;
pub(crate) mod rpc;
pub(crate) mod task;
pub(crate) mod user;
pub(crate) mod vm;

use crate::BulkArgs;
use anyhow::bail;
use std::io::BufRead;

/// Ids from arguments and, with `--stdin`, from standard input: the first CSV field of lines
/// starting with `/` (so `iris query ... -f csv | iris job cancel --stdin` works).
pub(crate) fn bulk_ids(b: &BulkArgs) -> anyhow::Result<Vec<String>> {
    let mut ids = b.ids.clone();
    if b.stdin {
        for line in std::io::stdin().lock().lines() {
            let line = line?;
            let first = line
                .split(',')
                .next()
                .unwrap_or("")
                .trim()
                .trim_matches('"');
            if first.starts_with('/') {
                ids.push(first.to_string());
            }
        }
    }
    if ids.is_empty() {
        bail!("no ids given: pass them as arguments or with --stdin");
    }
    Ok(ids)
}
