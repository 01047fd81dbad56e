//! The controller's error type, mapped to the wire once, at dispatch.
//!
//! Two kinds, kept apart (STYLE.md §2.5): an answer for the caller ([`Error::Rejected`]: a
//! Connect code and a message that names the field and the fix), and an internal failure (the
//! store, the file system, a bug) whose detail belongs in the controller's log, not in a
//! client's terminal. The client gets a short message with an error id to find that log line.

use iris_rpc::{Code, RpcError};
use rand::RngCore;

/// A failure of a controller operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request cannot be served as asked; the message is for the caller.
    #[error("{}", .0.message)]
    Rejected(RpcError),
    #[error("store: {0}")]
    Store(#[from] iris_store::Error),
    #[error("{0}")]
    Logs(#[from] iris_store::logs::LogError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<RpcError> for Error {
    fn from(e: RpcError) -> Self {
        Error::Rejected(e)
    }
}

impl Error {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Error::Rejected(RpcError::new(code, message))
    }

    /// INVALID_ARGUMENT: name the field and the fix.
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(Code::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Error::new(Code::NotFound, message)
    }

    pub fn precondition(message: impl Into<String>) -> Self {
        Error::new(Code::FailedPrecondition, message)
    }

    pub fn denied(message: impl Into<String>) -> Self {
        Error::new(Code::PermissionDenied, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::new(Code::Unavailable, message)
    }

    /// A write the state dir's full file system refused.
    pub fn is_disk_full(&self) -> bool {
        match self {
            Error::Store(e) => e.is_disk_full(),
            Error::Logs(e) => e.is_disk_full(),
            Error::Io(e) => e.kind() == std::io::ErrorKind::StorageFull,
            _ => false,
        }
    }

    /// An internal failure; `detail` is logged, never sent.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        Error::Internal(detail.to_string())
    }

    /// The wire error. Internal failures are logged here, once, under a fresh error id that the
    /// client's message carries.
    pub fn to_wire(&self) -> RpcError {
        match self {
            Error::Rejected(e) => e.clone(),
            other if other.is_disk_full() => {
                tracing::error!(error = %other, "the state dir's disk is full");
                RpcError::new(
                    Code::ResourceExhausted,
                    "the controller's state dir is on a full disk, so nothing was written; free space on it (running tasks keep running) and retry",
                )
            }
            other => {
                let id = error_id();
                tracing::error!(error_id = %id, error = %other, "internal error");
                RpcError::internal(format!(
                    "internal error (id {id}); the controller's log has the details"
                ))
            }
        }
    }
}

fn error_id() -> String {
    let mut b = [0u8; 4];
    rand::thread_rng().fill_bytes(&mut b);
    hex::encode(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_detail_stays_out_of_the_wire_message() {
        let e = Error::from(iris_store::Error::Invalid(
            "disk I/O error at page 7".into(),
        ));
        let w = e.to_wire();
        assert_eq!(w.code, Code::Internal);
        assert!(!w.message.contains("page 7"), "{}", w.message);
        assert!(w.message.contains("internal error (id "), "{}", w.message);
    }

    #[test]
    fn rejections_pass_through() {
        let w = Error::invalid("replicas: 0 is out of range; use 1 to 10000").to_wire();
        assert_eq!(w.code, Code::InvalidArgument);
        assert!(w.message.starts_with("replicas:"));
    }
}
