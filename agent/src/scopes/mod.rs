//! The cgroups watched against thresholds ("scopes"): what the --watch
//! flags and the engine ask for, the level each is at, and the band the
//! kernel compares it with.
pub mod levels;
pub mod monitor;
pub mod spec;
