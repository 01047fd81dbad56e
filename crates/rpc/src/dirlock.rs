//! One daemon per directory: an exclusive advisory lock (`flock`, through `std::fs::File::try_lock`)
//! on `<dir>/<name>.lock`, held for the daemon's lifetime. The kernel releases it when the process
//! exits, however it exits, so a crash leaves nothing to clean up (unlike a PID file); the file's
//! text names the holder (PID, and its address once it has one) for the refusal message.
//! Shared by the controller (its state dir) and worker daemons (their cache dirs).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// A held directory lock; released on drop.
#[derive(Debug)]
pub struct DirLock {
    file: File,
    path: PathBuf,
}

/// Why a directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{what} {dir} is in use by another {what_holder} ({holder}); stop that one first, or give this one a different directory")]
    Held {
        what: &'static str,
        what_holder: &'static str,
        dir: String,
        holder: String,
    },
    #[error("locking {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

impl DirLock {
    /// Locks `dir` for a `role` (e.g. "controller"), or says who holds it.
    pub fn acquire(dir: &Path, role: &'static str) -> Result<DirLock, LockError> {
        let path = dir.join(format!("{role}.lock"));
        let shown = path.display().to_string();
        let io = |source| LockError::Io {
            path: shown.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let holder = text.split_whitespace().collect::<Vec<_>>().join(" ");
                return Err(LockError::Held {
                    what: "directory",
                    what_holder: role,
                    dir: dir.display().to_string(),
                    holder: if holder.is_empty() {
                        "it has not recorded its PID yet".into()
                    } else {
                        holder
                    },
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        let lock = DirLock { file, path };
        lock.record(None).map_err(io)?;
        Ok(lock)
    }

    /// Records this process's PID and, once known, its address in the lock file.
    pub fn record(&self, address: Option<&str>) -> std::io::Result<()> {
        let mut f = &self.file;
        f.set_len(0)?;
        f.seek(SeekFrom::Start(0))?;
        let mut text = format!("pid {}", std::process::id());
        if let Some(a) = address {
            text.push_str(&format!(" address {a}"));
        }
        writeln!(f, "{text}")?;
        f.flush()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The process holding `dir`'s lock for `role`, as its lock file names it (the format
/// [`DirLock::record`] writes). `None` when no process holds the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: i32,
    /// Known once the holder serves.
    pub address: Option<String>,
}

pub fn holder(dir: &Path, role: &str) -> std::io::Result<Option<Holder>> {
    let path = dir.join(format!("{role}.lock"));
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // A shared lock is granted only when nobody holds the exclusive one; it is released when
    // `file` drops, at the end of this function.
    match file.try_lock_shared() {
        Ok(()) => return Ok(None),
        Err(TryLockError::WouldBlock) => {}
        Err(TryLockError::Error(e)) => return Err(e),
    }
    Ok(parse_holder(
        &std::fs::read_to_string(&path).unwrap_or_default(),
    ))
}

/// `pid 123 address http://127.0.0.1:4000`.
fn parse_holder(text: &str) -> Option<Holder> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let value = |key: &str| {
        words
            .iter()
            .position(|w| *w == key)
            .and_then(|i| words.get(i + 1))
            .map(|s| s.to_string())
    };
    Some(Holder {
        pid: value("pid")?.parse().ok()?,
        address: value("address"),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_lock_file_names_its_holder() {
        use super::{parse_holder, Holder};
        assert_eq!(
            parse_holder("pid 42 address http://127.0.0.1:9\n"),
            Some(Holder {
                pid: 42,
                address: Some("http://127.0.0.1:9".into())
            })
        );
        assert_eq!(
            parse_holder("pid 7\n"),
            Some(Holder {
                pid: 7,
                address: None
            })
        );
        assert_eq!(parse_holder(""), None);
    }

    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid_until_it_lets_go() {
        let dir = std::env::temp_dir().join(format!("iris-dirlock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let first = DirLock::acquire(&dir, "controller").expect("first");
        first.record(Some("http://127.0.0.1:1")).expect("record");
        let e = DirLock::acquire(&dir, "controller").expect_err("second");
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        assert!(
            msg.contains("http://127.0.0.1:1") && msg.contains("in use"),
            "{msg}"
        );
        drop(first);
        DirLock::acquire(&dir, "controller").expect("free again");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
