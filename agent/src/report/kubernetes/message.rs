//! kubelet's eviction message, word for word
//! (pkg/kubelet/eviction/helpers.go `evictionMessage`), so that tools and
//! people reading `kubectl describe pod` see the same text whichever agent
//! evicted the pod.
use std::collections::BTreeMap;

use crate::{decide::thresholds::Resource, quantity::Quantity};

/// Event annotations kubelet adds to the `Evicted` event.
pub(crate) const OFFENDING_CONTAINERS_KEY: &str = "offending_containers";
pub(crate) const OFFENDING_CONTAINERS_USAGE_KEY: &str = "offending_containers_usage";
pub(crate) const STARVED_RESOURCE_KEY: &str = "starved_resource";
/// evictd's own annotation of the `Evicted` event: why the pod was killed
/// (`KillReason::as_str`).
pub const KILL_REASON_KEY: &str = "evictd.io/kill-reason";

/// One container of the victim as it was just before the kill.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerUsage {
    pub name: String,
    /// Its use of the starved resource in bytes: for memory the working
    /// set, read from the container's cgroup; for ephemeral storage its
    /// writable layer and logs, from the container runtime. `None` when it
    /// could not be read (kubelet then leaves the container out too).
    pub usage_bytes: Option<u64>,
    /// The container's request of the starved resource; none is "0".
    pub request: Option<Quantity>,
}

/// The starved signal as the engine saw it: threshold and available amount
/// in the signal's unit (bytes, or a count for PIDs and inodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StarvedSignal {
    pub resource: Resource,
    pub threshold: i64,
    pub available: i64,
}

/// The message for the pod's status and `Evicted` event, and the event's
/// annotations.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionMessage {
    pub text: String,
    pub annotations: BTreeMap<String, String>,
}

/// kubelet's `evictionMessage`: the resource, the threshold met and what
/// was available, then, for memory and ephemeral storage, every container
/// using more than it requested. Each sentence ends in a space, as
/// kubelet's do.
pub fn eviction_message(signal: StarvedSignal, containers: &[ContainerUsage]) -> EvictionMessage {
    let resource = signal.resource.as_str();
    // Bytes print in binary units (BinarySI), counts in decimal ones, as
    // kubelet's signal observations are built.
    let bytes = signal.resource.in_bytes();
    let mut text = format!("The node was low on resource: {resource}. ");
    text.push_str(&format!(
        "Threshold quantity: {}, available: {}. ",
        Quantity::from_units(signal.threshold, bytes),
        Quantity::from_units(signal.available, bytes),
    ));
    let mut offending = Vec::new();
    let mut offending_usage = Vec::new();
    if bytes {
        for container in containers {
            let Some(bytes) = container.usage_bytes else {
                continue;
            };
            let usage = Quantity::from_units(i64::try_from(bytes).unwrap_or(i64::MAX), true);
            let request = container.request.unwrap_or(Quantity::from_units(0, false));
            if usage > request {
                text.push_str(&format!(
                    "Container {} was using {usage}, request is {request}, has larger consumption of {resource}. ",
                    container.name
                ));
                offending.push(container.name.clone());
                offending_usage.push(usage.to_string());
            }
        }
    }
    let annotations = BTreeMap::from([
        (OFFENDING_CONTAINERS_KEY.to_owned(), offending.join(",")),
        (
            OFFENDING_CONTAINERS_USAGE_KEY.to_owned(),
            offending_usage.join(","),
        ),
        (STARVED_RESOURCE_KEY.to_owned(), resource.to_owned()),
    ]);
    EvictionMessage { text, annotations }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: i64 = 1 << 20;

    fn container(name: &str, bytes: Option<u64>, request: Option<&str>) -> ContainerUsage {
        ContainerUsage {
            name: name.into(),
            usage_bytes: bytes,
            request: request.map(|r| Quantity::parse(r).unwrap()),
        }
    }

    #[test]
    fn memory_names_each_container_over_its_request_as_kubelet_does() {
        let message = eviction_message(
            StarvedSignal {
                resource: Resource::Memory,
                threshold: 100 * MI,
                available: 50 * MI,
            },
            &[
                container("app", Some(1 << 30), None),
                container("sidecar", Some(10 << 20), Some("64Mi")),
                container("cache", Some(200 << 20), Some("128Mi")),
                container("gone", None, None),
            ],
        );
        assert_eq!(
            message.text,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. \
             Container app was using 1Gi, request is 0, has larger consumption of memory. \
             Container cache was using 200Mi, request is 128Mi, has larger consumption of memory. "
        );
        assert_eq!(message.annotations[OFFENDING_CONTAINERS_KEY], "app,cache");
        assert_eq!(
            message.annotations[OFFENDING_CONTAINERS_USAGE_KEY],
            "1Gi,200Mi"
        );
        assert_eq!(message.annotations[STARVED_RESOURCE_KEY], "memory");
    }

    #[test]
    fn ephemeral_storage_names_each_container_over_its_request_as_kubelet_does() {
        let message = eviction_message(
            StarvedSignal {
                resource: Resource::EphemeralStorage,
                threshold: 64 * MI,
                available: 32 * MI,
            },
            &[
                container("filler", Some(300 << 20), None),
                container("quiet", Some(1 << 20), Some("10Mi")),
            ],
        );
        assert_eq!(
            message.text,
            "The node was low on resource: ephemeral-storage. Threshold quantity: 64Mi, available: 32Mi. \
             Container filler was using 300Mi, request is 0, has larger consumption of ephemeral-storage. "
        );
        assert_eq!(message.annotations[OFFENDING_CONTAINERS_KEY], "filler");
        assert_eq!(message.annotations[OFFENDING_CONTAINERS_USAGE_KEY], "300Mi");
    }

    #[test]
    fn quantities_print_in_kubernetes_canonical_form() {
        // Not a multiple of 1Ki: plain bytes, as BinarySI prints them.
        // (kubelet prints a threshold given as "1G" as "1G"; evictd keeps
        // thresholds as bytes, so a decimal-unit threshold prints in bytes.)
        let message = eviction_message(
            StarvedSignal {
                resource: Resource::Memory,
                threshold: 1_000_000_000,
                available: 52_428_801,
            },
            &[container("app", Some(1_572_864), Some("1G"))],
        );
        assert_eq!(
            message.text,
            "The node was low on resource: memory. Threshold quantity: 1000000000, available: 52428801. "
        );
    }

    #[test]
    fn pids_are_counts_and_name_no_container() {
        let message = eviction_message(
            StarvedSignal {
                resource: Resource::Pids,
                threshold: 1000,
                available: -3,
            },
            &[container("app", Some(1 << 30), None)],
        );
        assert_eq!(
            message.text,
            "The node was low on resource: pids. Threshold quantity: 1k, available: -3. "
        );
        assert_eq!(message.annotations[OFFENDING_CONTAINERS_KEY], "");
        assert_eq!(message.annotations[STARVED_RESOURCE_KEY], "pids");
    }
}
