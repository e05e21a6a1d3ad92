//! CRI objects for the runtime modules' unit tests.
use k8s_cri::v1::{
    Container, ContainerMetadata, ContainerState, ImageSpec, PodSandbox, PodSandboxMetadata,
    PodSandboxState,
};

/// A sandbox of pod `uid` in namespace `default`.
pub fn sandbox(id: &str, uid: &str, ready: bool, created_at: i64) -> PodSandbox {
    PodSandbox {
        id: id.into(),
        metadata: Some(PodSandboxMetadata {
            name: format!("pod-{uid}"),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        state: if ready {
            PodSandboxState::SandboxReady
        } else {
            PodSandboxState::SandboxNotready
        } as i32,
        created_at,
        ..PodSandbox::default()
    }
}

/// A container `name` of sandbox `sandbox`.
pub fn container(
    id: &str,
    sandbox: &str,
    name: &str,
    state: ContainerState,
    created_at: i64,
) -> Container {
    Container {
        id: id.into(),
        pod_sandbox_id: sandbox.into(),
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        state: state as i32,
        created_at,
        ..Container::default()
    }
}

/// `container` started from `image` (a name or id, as runtimes report it).
pub fn on_image(container: Container, image: &str) -> Container {
    Container {
        image: Some(ImageSpec {
            image: image.into(),
            ..ImageSpec::default()
        }),
        image_ref: image.into(),
        ..container
    }
}
