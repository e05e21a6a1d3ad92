//! evictd: a Kubernetes node agent that detects memory and PID pressure in
//! the kernel (eBPF on tracepoints) and keeps kubelet's eviction policy.
