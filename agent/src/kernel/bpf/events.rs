//! Ring-buffer records: decoding, and the stream the agent reads them from.
use std::time::Duration;

use aya::maps::{MapData, RingBuf};
use evictd_common::{
    CgroupEvent, CrossingEvent, EVENT_CGROUP_MKDIR, EVENT_CGROUP_RMDIR, EVENT_CROSSING,
    EVENT_OOM_VICTIM, OomVictimEvent,
};
use tokio::io::unix::AsyncFd;

use super::{BpfError, ScopeKind};

/// One ring-buffer record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelEvent {
    Crossing(Crossing),
    OomVictim(OomVictimEvent),
    CgroupCreated(CgroupChange),
    CgroupRemoved(CgroupChange),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crossing {
    pub kind: ScopeKind,
    pub raw: CrossingEvent,
}

impl Crossing {
    pub fn rising(&self) -> bool {
        self.raw.rising != 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupChange(pub CgroupEvent);

impl CgroupChange {
    /// The path relative to its hierarchy root, and whether the kernel had
    /// to cut it.
    pub fn path(&self) -> (String, bool) {
        let len = (self.0.path_len as usize).min(self.0.path.len());
        let bytes = &self.0.path[..len];
        let text = bytes.split(|b| *b == 0).next().unwrap_or_default();
        (
            String::from_utf8_lossy(text).into_owned(),
            len == self.0.path.len(),
        )
    }
}

impl KernelEvent {
    pub fn timestamp_ns(&self) -> u64 {
        match self {
            Self::Crossing(c) => c.raw.timestamp_ns,
            Self::OomVictim(o) => o.timestamp_ns,
            Self::CgroupCreated(c) | Self::CgroupRemoved(c) => c.0.timestamp_ns,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Self::Crossing(_) => "crossing",
            Self::OomVictim(_) => "oom_victim",
            Self::CgroupCreated(_) => "cgroup_mkdir",
            Self::CgroupRemoved(_) => "cgroup_rmdir",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("record of {0} bytes is too short for a header")]
    Short(usize),
    #[error("record kind {kind} needs {needed} bytes, got {got}")]
    Truncated {
        kind: u32,
        needed: usize,
        got: usize,
    },
    #[error("unknown record kind {0}")]
    UnknownKind(u32),
    #[error("unknown resource {0}")]
    UnknownResource(u32),
}

fn read_record<T: Copy>(bytes: &[u8], kind: u32) -> Result<T, DecodeError> {
    let needed = size_of::<T>();
    if bytes.len() < needed {
        return Err(DecodeError::Truncated {
            kind,
            needed,
            got: bytes.len(),
        });
    }
    // SAFETY: length checked; T is a repr(C) integer-only type from
    // evictd-common, valid for any bit pattern; read_unaligned needs no
    // alignment.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// Decodes one ring-buffer record.
pub fn decode(bytes: &[u8]) -> Result<KernelEvent, DecodeError> {
    let kind = bytes
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or(DecodeError::Short(bytes.len()))?;
    match kind {
        EVENT_CROSSING => {
            let raw: CrossingEvent = read_record(bytes, kind)?;
            let kind = ScopeKind::from_raw(raw.resource)
                .ok_or(DecodeError::UnknownResource(raw.resource))?;
            Ok(KernelEvent::Crossing(Crossing { kind, raw }))
        }
        EVENT_OOM_VICTIM => Ok(KernelEvent::OomVictim(read_record(bytes, kind)?)),
        EVENT_CGROUP_MKDIR => Ok(KernelEvent::CgroupCreated(CgroupChange(read_record(
            bytes, kind,
        )?))),
        EVENT_CGROUP_RMDIR => Ok(KernelEvent::CgroupRemoved(CgroupChange(read_record(
            bytes, kind,
        )?))),
        other => Err(DecodeError::UnknownKind(other)),
    }
}

/// CLOCK_MONOTONIC now, in the nanoseconds `bpf_ktime_get_ns()` uses.
pub fn monotonic_now_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(Duration::from)
        .unwrap_or_default();
    now.as_nanos() as u64
}

/// An event with the time userspace read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub event: KernelEvent,
    pub received_ns: u64,
}

impl Received {
    /// Kernel timestamp to userspace read.
    pub(crate) fn latency(&self) -> Duration {
        Duration::from_nanos(self.received_ns.saturating_sub(self.event.timestamp_ns()))
    }
}

/// Ring-buffer reader woken by the kernel through epoll.
pub struct EventStream {
    ring: AsyncFd<RingBuf<MapData>>,
}

impl EventStream {
    pub(super) fn new(ring: AsyncFd<RingBuf<MapData>>) -> Self {
        Self { ring }
    }

    /// Waits for records and appends every one available to `out`. Records
    /// that do not decode are returned as errors in place, never dropped
    /// silently.
    pub async fn next_batch(
        &mut self,
        out: &mut Vec<Result<Received, DecodeError>>,
    ) -> Result<(), BpfError> {
        let mut guard = self.ring.readable_mut().await.map_err(BpfError::Poll)?;
        let ring = guard.get_inner_mut();
        while let Some(record) = ring.next() {
            let received_ns = monotonic_now_ns();
            out.push(decode(&record).map(|event| Received { event, received_ns }));
        }
        guard.clear_ready();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use evictd_common::{CGROUP_PATH_LEN, RESOURCE_PIDS};

    use super::*;

    fn bytes_of<T: Copy>(value: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a repr(C) integer-only value.
        unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
            .to_vec()
    }

    #[test]
    fn decodes_a_crossing() {
        let raw = CrossingEvent {
            kind: EVENT_CROSSING,
            resource: RESOURCE_PIDS,
            timestamp_ns: 5,
            scope_id: 7,
            trigger_cgroup_id: 9,
            value: 100,
            bound: 90,
            rising: 1,
            _pad: 0,
        };
        let event = decode(&bytes_of(&raw)).unwrap();
        let KernelEvent::Crossing(crossing) = event else {
            panic!("{event:?}")
        };
        assert_eq!(crossing.kind, ScopeKind::Pids);
        assert!(crossing.rising());
        assert_eq!(crossing.raw, raw);
    }

    #[test]
    fn decodes_a_cgroup_path() {
        let mut raw = CgroupEvent {
            kind: EVENT_CGROUP_MKDIR,
            hierarchy_id: 3,
            timestamp_ns: 1,
            cgroup_id: 42,
            level: 2,
            path_len: 0,
            path: [0xaa; CGROUP_PATH_LEN],
        };
        let path = b"/kubepods/pod1\0";
        raw.path[..path.len()].copy_from_slice(path);
        raw.path_len = path.len() as u32;
        let KernelEvent::CgroupCreated(change) = decode(&bytes_of(&raw)).unwrap() else {
            panic!()
        };
        assert_eq!(change.path(), ("/kubepods/pod1".to_owned(), false));
        raw.path = [b'a'; CGROUP_PATH_LEN];
        raw.path_len = CGROUP_PATH_LEN as u32;
        assert!(CgroupChange(raw).path().1, "a full buffer may be cut");
    }

    #[test]
    fn rejects_short_and_unknown_records() {
        assert_eq!(decode(&[1, 0]), Err(DecodeError::Short(2)));
        assert_eq!(
            decode(&[EVENT_OOM_VICTIM as u8, 0, 0, 0, 0, 0, 0, 0]),
            Err(DecodeError::Truncated {
                kind: EVENT_OOM_VICTIM,
                needed: size_of::<OomVictimEvent>(),
                got: 8
            })
        );
        assert_eq!(decode(&[99, 0, 0, 0]), Err(DecodeError::UnknownKind(99)));
    }
}
