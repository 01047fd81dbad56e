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

#[cfg(test)]
mod tests {
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
