//! The agent's entry points: `evictd run` (the daemon) and `evictd
//! simulate`.
pub mod daemon;
pub mod precise;
pub mod simulate;
