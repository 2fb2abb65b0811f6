//! The backend side: one blocking request over the socket, with a deadline, calling back
//! between short waits so a PostgreSQL backend can serve interrupts.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use super::protocol::{decode, encode, AdminRequest, AdminResponse, MAX_RESPONSE_BYTES};
use super::AdminError;

/// The longest single wait before `between_waits` runs again.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// Sends `request` to the engine at `path` and returns its answer, or fails after
/// `timeout`. `between_waits` runs at least every 100 ms while waiting.
pub fn call(
    path: &Path,
    request: &AdminRequest,
    timeout: Duration,
    mut between_waits: impl FnMut(),
) -> Result<AdminResponse, AdminError> {
    let deadline = Instant::now() + timeout;
    let mut stream = UnixStream::connect(path).map_err(|source| AdminError::NotRunning {
        path: path.to_owned(),
        source,
    })?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(&encode(request))?;
    stream.set_read_timeout(Some(WAIT_SLICE))?;
    let mut line = Vec::new();
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                line.extend_from_slice(&buffer[..n]);
                if line.len() > MAX_RESPONSE_BYTES {
                    return Err(AdminError::TooLarge {
                        max: MAX_RESPONSE_BYTES,
                    });
                }
                if line.ends_with(b"\n") {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
        between_waits();
        if Instant::now() >= deadline {
            return Err(AdminError::Timeout(timeout));
        }
    }
    decode(&line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_engine_times_out_and_the_caller_runs_between_waits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut waits = 0;
        let err = call(
            &path,
            &AdminRequest::Streams,
            Duration::from_millis(350),
            || waits += 1,
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("PSM_A1005"), "{err}");
        assert!(waits >= 3, "{waits}");
        drop(listener);
    }

    #[test]
    fn a_missing_socket_means_the_engine_is_not_running() {
        let dir = tempfile::tempdir().unwrap();
        let err = call(
            &dir.path().join("absent.sock"),
            &AdminRequest::Buckets,
            Duration::from_secs(1),
            || {},
        )
        .unwrap_err();
        assert!(matches!(err, AdminError::NotRunning { .. }), "{err}");
    }
}
