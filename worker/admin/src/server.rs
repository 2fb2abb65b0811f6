//! The engine side: binds the socket (0600, replacing a stale one) and answers each
//! connection's one request until the engine stops; removes the socket file then.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};

use super::answer::answer;
use super::protocol::{
    decode, encode, AdminRequest, AdminResponse, MAX_PATH_BYTES, MAX_REQUEST_BYTES,
};
use super::AdminError;
use service::SyncService;

/// How long a client gets to send its request line.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Admin requests answered at once; more wait.
const MAX_CONCURRENT: usize = 4;

/// Binds `path` with mode 0600. A socket left by an earlier engine is replaced; any other
/// file of that name is refused.
pub fn bind(path: &Path) -> Result<UnixListener, AdminError> {
    let bytes = path.as_os_str().len();
    if bytes > MAX_PATH_BYTES {
        return Err(AdminError::PathTooLong {
            path: path.to_owned(),
            bytes,
            max: MAX_PATH_BYTES,
        });
    }
    let bind_error = |source| AdminError::Bind {
        path: path.to_owned(),
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(bind_error)?
        }
        Ok(_) => {
            return Err(AdminError::Foreign {
                path: path.to_owned(),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(bind_error(e)),
    }
    let listener = UnixListener::bind(path).map_err(bind_error)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(bind_error)?;
    Ok(listener)
}

/// Answers connections on `listener` until `stop` turns true, then removes `path` unless
/// another engine has bound it since (a detached engine must not remove its successor's).
pub async fn serve(
    listener: UnixListener,
    path: PathBuf,
    sync: Arc<SyncService>,
    mut stop: watch::Receiver<bool>,
) {
    let ours = identity(&path);
    let limit = Arc::new(Semaphore::new(MAX_CONCURRENT));
    loop {
        tokio::select! {
            _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let sync = sync.clone();
                    let limit = limit.clone();
                    tokio::spawn(async move {
                        let Ok(_permit) = limit.acquire_owned().await else { return };
                        if let Err(e) = connection(stream, &sync).await {
                            tracing::debug!(error = %e, "admin connection failed");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting an admin connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    if ours.is_some() && identity(&path) == ours {
        let _ = std::fs::remove_file(&path);
    }
}

/// Device and inode of the file at `path`.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

async fn connection(stream: UnixStream, sync: &Arc<SyncService>) -> Result<(), AdminError> {
    let (read, mut write) = stream.into_split();
    let mut line = Vec::new();
    let mut reader = BufReader::new(read).take(MAX_REQUEST_BYTES as u64 + 1);
    let read = tokio::time::timeout(REQUEST_TIMEOUT, reader.read_until(b'\n', &mut line)).await;
    let response = match read {
        Err(_) => return Err(AdminError::Timeout(REQUEST_TIMEOUT)),
        Ok(Err(e)) => return Err(e.into()),
        Ok(Ok(_)) if line.len() > MAX_REQUEST_BYTES => AdminResponse::error(
            "PSM_A1008",
            format!("the request exceeds {MAX_REQUEST_BYTES} bytes"),
            "send smaller claims and parameters",
        ),
        Ok(Ok(_)) => match decode::<AdminRequest>(&line) {
            Ok(request) => answer(request, sync).await,
            Err(e) => AdminResponse::error(
                "PSM_A1007",
                e.to_string(),
                "update the extension and the worker together",
            ),
        },
    };
    write.write_all(&encode(&response)).await?;
    write.shutdown().await?;
    Ok(())
}
