//! Acting on pressure: the evictor loop (one observation per wake-up,
//! decisions, their execution), the seams it reaches the world through,
//! the pre-kill hook, and the kill of a pod.
pub mod evictor;
pub(crate) mod io;
pub mod kill;
pub(crate) mod pre_kill;
pub(crate) mod timer;
pub(crate) mod wake;
