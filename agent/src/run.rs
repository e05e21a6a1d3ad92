//! The agent's entry points: `evictd run` (the daemon), `evictd simulate`
//! and `evictd seccomp-profile`.
pub mod daemon;
pub(crate) mod precise;
pub mod seccomp;
pub mod simulate;
