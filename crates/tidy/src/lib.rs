//! Architecture invariants of the workspace, checked by `tests/tidy.rs` over the source tree.
//! No code of its own: each rule is a test that fails, naming the file and line, when the rule
//! is broken. ARCHITECTURE.md names the test that keeps each invariant true.
