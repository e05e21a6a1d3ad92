//! The cgroups watched against thresholds ("scopes"): what the --watch
//! flags ask for ([`spec`]), the level each is at ([`levels`]), the pure
//! state of them all (`registry`), the lines the engine has the kernel
//! watch (`tripwires`), when the precise memory hooks run (`zone`),
//! and the shell that reads, arms and reports them
//! (`monitor`).
pub mod levels;
pub(crate) mod monitor;
pub(crate) mod registry;
pub mod spec;
pub(crate) mod tripwires;
pub(crate) mod zone;
