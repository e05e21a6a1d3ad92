//! Kubernetes' arithmetic on a pod's resources, as kubelet's eviction
//! ranking, its local-storage limits and its QoS classes use it: a pod's
//! request for a resource (`GetResourceRequestQuantity`,
//! pkg/api/v1/resource/helpers.go, over component-helpers' `PodRequests`),
//! its ephemeral-storage limit (component-helpers' `PodLimits`) and its QoS
//! class (`ComputePodQOS`, pkg/apis/core/v1/helper/qos/qos.go), all with
//! init containers, sidecars, pod overhead and pod-level resources (the
//! `PodLevelResources` feature, on by default since Kubernetes 1.34).
//!
//! kubelet sees pods after the API server's defaulting (`SetDefaults_Pod`,
//! pkg/apis/core/v1/defaults.go); a snapshot written by hand may not have
//! been through it, so it is applied here first. It is idempotent, so a pod
//! read from the API is unchanged by it.
use crate::{
    decide::snapshot::{ContainerSpec, PodSnapshot, QosClass, ResourceList},
    quantity::Quantity,
};

const CPU: &str = "cpu";
const MEMORY: &str = "memory";
const HUGEPAGES_PREFIX: &str = "hugepages-";
const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
/// An init container with this `restartPolicy` is a sidecar.
const RESTART_ALWAYS: &str = "Always";

/// The pod's request for `resource` as kubelet's
/// `GetResourceRequestQuantity` computes it for eviction ranking: where
/// the pod sets pod-level resources, its pod-level request (and nothing
/// from its containers, whatever the resource); otherwise the containers'
/// aggregate (`aggregate_requests`). Then `spec.overhead` is added, only to a
/// request that is not zero. `None` where the pod requests none.
pub fn request(pod: &PodSnapshot, resource: &str) -> Option<Quantity> {
    let request = if pod.resources.is_none() && pod.init_containers.is_empty() {
        regular_containers_request(pod, resource)?
    } else {
        defaulted_request(pod, resource)?
    };
    match pod.overhead.get(resource) {
        Some(overhead) if !request.is_zero() => Some(request.saturating_add(*overhead)),
        _ => Some(request),
    }
}

/// [`defaulted_request`] for a pod of regular containers only, the common
/// case, without building the defaulted spec: the sum of each container's
/// request, defaulted to its limit. Rankings ask this of every pod.
fn regular_containers_request(pod: &PodSnapshot, resource: &str) -> Option<Quantity> {
    pod.containers
        .iter()
        .filter_map(|c| c.requests.get(resource).or_else(|| c.limits.get(resource)))
        .copied()
        .reduce(Quantity::saturating_add)
}

/// The request before overhead, through the API server's defaulting and
/// kubelet's `PodRequests`.
fn defaulted_request(pod: &PodSnapshot, resource: &str) -> Option<Quantity> {
    let spec = DefaultedSpec::of(pod);
    let mut requests = match &spec.pod_level {
        // PodRequests with SkipContainerLevelResources.
        Some(pod_level) if is_pod_level_set(pod_level) => ResourceList::new(),
        _ => aggregate_requests(&spec.containers),
    };
    // PodRequests' applyPodLevelResources: pod-level requests replace the
    // containers' for the resources pod-level resources support.
    if let Some(pod_level) = &spec.pod_level {
        for (name, quantity) in &pod_level.requests {
            if is_pod_level_resource(name) {
                requests.insert(name.clone(), *quantity);
            }
        }
    }
    requests.remove(resource)
}

/// The QoS class as Kubernetes' `ComputePodQOS` derives it (the API server
/// stores it in `status.qosClass` when the pod is created): from pod-level
/// resources where `spec.resources` is set at all, otherwise from every
/// container, init containers included. Only cpu and memory count.
pub(crate) fn qos_class(pod: &PodSnapshot) -> QosClass {
    let spec = DefaultedSpec::of(pod);
    if let Some(pod_level) = &spec.pod_level {
        return resource_qos(&pod_level.requests, &pod_level.limits);
    }
    let mut classes = spec
        .containers
        .iter()
        .map(|c| resource_qos(&c.requests, c.limits));
    let Some(first) = classes.next() else {
        return QosClass::BestEffort;
    };
    // One Burstable container, or two that disagree, make the pod Burstable.
    classes.fold(first, |pod_class, class| {
        if class == pod_class {
            pod_class
        } else {
            QosClass::Burstable
        }
    })
}

/// `resourceQOS`: one set of requests and limits. Guaranteed when cpu and
/// memory are both requested at their (non-zero) limits, BestEffort when
/// neither is requested nor limited, Burstable otherwise.
fn resource_qos(requests: &ResourceList, limits: &ResourceList) -> QosClass {
    let set = |list: &ResourceList, name| list.get(name).filter(|q| !q.is_zero()).copied();
    let class = |name| match (set(requests, name), set(limits, name)) {
        (None, None) => QosClass::BestEffort,
        (Some(request), Some(limit)) if request == limit => QosClass::Guaranteed,
        _ => QosClass::Burstable,
    };
    match (class(CPU), class(MEMORY)) {
        (cpu, memory) if cpu == memory => cpu,
        _ => QosClass::Burstable,
    }
}

/// One container after the API server's defaulting.
struct Container<'a> {
    /// Requests, each missing one defaulted to the container's limit.
    requests: ResourceList,
    limits: &'a ResourceList,
    kind: ContainerKind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ContainerKind {
    Regular,
    Init,
    Sidecar,
}

/// A pod's resources after the API server's defaulting.
struct DefaultedSpec<'a> {
    /// Regular containers first, then init containers in their order.
    containers: Vec<Container<'a>>,
    pod_level: Option<PodLevel>,
}

/// Pod-level `spec.resources` after defaulting.
struct PodLevel {
    requests: ResourceList,
    limits: ResourceList,
}

impl<'a> DefaultedSpec<'a> {
    fn of(pod: &'a PodSnapshot) -> Self {
        let regular = pod
            .containers
            .iter()
            .map(|spec| container(spec, ContainerKind::Regular));
        let init = pod.init_containers.iter().map(|spec| {
            let sidecar = spec.restart_policy.as_deref() == Some(RESTART_ALWAYS);
            container(
                spec,
                if sidecar {
                    ContainerKind::Sidecar
                } else {
                    ContainerKind::Init
                },
            )
        });
        let containers: Vec<Container<'a>> = regular.chain(init).collect();
        let pod_level = pod.resources.as_ref().map(|resources| PodLevel {
            requests: default_pod_requests(&resources.requests, &resources.limits, &containers),
            limits: resources.limits.clone(),
        });
        Self {
            containers,
            pod_level,
        }
    }
}

/// `SetDefaults_Pod` for one container (regular or init): a resource with
/// a limit and no request is requested at its limit.
fn container(spec: &ContainerSpec, kind: ContainerKind) -> Container<'_> {
    let mut requests = spec.requests.clone();
    for (name, limit) in &spec.limits {
        requests.entry(name.clone()).or_insert(*limit);
    }
    Container {
        requests,
        limits: &spec.limits,
        kind,
    }
}

/// `defaultPodRequests`: only where pod-level limits are set, a pod-level
/// request missing for cpu or memory becomes the containers' aggregate
/// request for it, if they request it, and otherwise any missing pod-level
/// request becomes its pod-level limit.
fn default_pod_requests(
    requests: &ResourceList,
    limits: &ResourceList,
    containers: &[Container<'_>],
) -> ResourceList {
    let mut defaulted = requests.clone();
    if limits.is_empty() {
        return defaulted;
    }
    // Overcommittable pod-level resources: cpu and memory, not hugepages.
    for (name, quantity) in aggregate_requests(containers) {
        if name == CPU || name == MEMORY {
            defaulted.entry(name).or_insert(quantity);
        }
    }
    for (name, limit) in limits {
        if is_pod_level_resource(name) {
            defaulted.entry(name.clone()).or_insert(*limit);
        }
    }
    defaulted
}

/// component-helpers' `AggregateContainerRequests` (the sidecar KEP's
/// formula): the sum over regular containers and sidecars, or, if larger
/// for a resource, what the pod needs while an init container runs: that
/// container plus the sidecars declared (and so started) before it.
fn aggregate_requests(containers: &[Container<'_>]) -> ResourceList {
    aggregate(containers.iter().map(|c| (c.kind, &c.requests)))
}

/// The pod's ephemeral-storage limit as kubelet's `PodLimits` computes it
/// for the pod-level local-storage check
/// (`podEphemeralStorageLimitEviction`): the containers' limits aggregated
/// as requests are (`AggregateContainerLimits`: regular containers and
/// sidecars summed, each init container with the sidecars declared before
/// it, the larger), then `spec.overhead` added when that is not zero.
/// Limits are not defaulted from anything, and pod-level resources do not
/// name ephemeral storage (`IsSupportedPodLevelResource`). `None` where no
/// container limits it.
pub fn ephemeral_storage_limit(pod: &PodSnapshot) -> Option<Quantity> {
    let spec = DefaultedSpec::of(pod);
    let limit =
        aggregate(spec.containers.iter().map(|c| (c.kind, c.limits))).remove(EPHEMERAL_STORAGE)?;
    match pod.overhead.get(EPHEMERAL_STORAGE) {
        Some(overhead) if !limit.is_zero() => Some(limit.saturating_add(*overhead)),
        _ => Some(limit),
    }
}

/// The sidecar KEP's aggregate of one resource list per container, in
/// spec order (regular containers first, then init containers).
fn aggregate<'a>(
    containers: impl Iterator<Item = (ContainerKind, &'a ResourceList)>,
) -> ResourceList {
    let mut running = ResourceList::new();
    let mut sidecars = ResourceList::new();
    let mut while_initialising = ResourceList::new();
    for (kind, resources) in containers {
        match kind {
            ContainerKind::Regular => add(&mut running, resources),
            ContainerKind::Sidecar => {
                add(&mut running, resources);
                add(&mut sidecars, resources);
                keep_max(&mut while_initialising, &sidecars);
            }
            ContainerKind::Init => {
                let mut needed = resources.clone();
                add(&mut needed, &sidecars);
                keep_max(&mut while_initialising, &needed);
            }
        }
    }
    keep_max(&mut running, &while_initialising);
    running
}

fn add(sum: &mut ResourceList, resources: &ResourceList) {
    for (name, quantity) in resources {
        sum.entry(name.clone())
            .and_modify(|total| *total = total.saturating_add(*quantity))
            .or_insert(*quantity);
    }
}

fn keep_max(max: &mut ResourceList, resources: &ResourceList) {
    for (name, quantity) in resources {
        max.entry(name.clone())
            .and_modify(|kept| *kept = (*kept).max(*quantity))
            .or_insert(*quantity);
    }
}

/// `IsSupportedPodLevelResource`: cpu, memory and hugepages.
fn is_pod_level_resource(name: &str) -> bool {
    name == CPU || name == MEMORY || name.starts_with(HUGEPAGES_PREFIX)
}

/// `IsPodLevelResourcesSet`: pod-level requests or limits name a resource
/// pod-level resources support.
fn is_pod_level_set(pod_level: &PodLevel) -> bool {
    pod_level
        .requests
        .keys()
        .chain(pod_level.limits.keys())
        .any(|name| is_pod_level_resource(name))
}

#[cfg(test)]
mod tests;
