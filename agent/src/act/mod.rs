//! Acting on a decision: the evictor loop and the kill of a pod.
pub mod evictor;
pub mod kill;
