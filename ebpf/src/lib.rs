// The programs live in the `evictd` binary target, built for bpfel-unknown-none
// by agent/build.rs. This empty library lets the agent name the crate as a
// build dependency, so cargo rebuilds the agent when the programs change.
#![no_std]
