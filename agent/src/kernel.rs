//! What the kernel offers and how it pushes pressure to the agent: the
//! capabilities probed at startup, the trigger chosen per resource, the
//! eBPF programs and their maps, and the notifiers that need no BPF.
pub mod bpf;
pub mod btf;
pub mod capabilities;
pub mod notify;
pub mod triggers;
