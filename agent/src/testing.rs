//! Helpers for unit tests: what the code under test logged.
use std::{
    io,
    sync::{Arc, Mutex, PoisonError},
};

use tracing::subscriber::DefaultGuard;
use tracing_subscriber::fmt::MakeWriter;

/// Log lines (debug and up) written on this thread while the capture is
/// alive.
#[derive(Clone, Default)]
pub(crate) struct LogCapture {
    text: Arc<Mutex<Vec<u8>>>,
}

impl LogCapture {
    /// Starts capturing; the returned guard ends it.
    pub(crate) fn start() -> (Self, DefaultGuard) {
        let capture = Self::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(capture.clone())
            .finish();
        (capture, tracing::subscriber::set_default(subscriber))
    }

    pub(crate) fn lines(&self) -> Vec<String> {
        let text = self.text.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&text)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Lines at WARN or ERROR.
    pub(crate) fn problems(&self) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
            .collect()
    }

    pub(crate) fn contains(&self, text: &str) -> bool {
        self.lines().iter().any(|line| line.contains(text))
    }
}

impl io::Write for LogCapture {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.text
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogCapture {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
