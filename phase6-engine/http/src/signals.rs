//! Chapter 6.3: the signals that stop a server. Ctrl-C sends SIGINT; systemd, Docker and
//! Kubernetes send SIGTERM. Both mean "drain, then exit", so either completes the future.

/// Completes at the first SIGINT or SIGTERM. If no handler can be installed, it never
/// completes and the server runs until the process is killed.
pub async fn stop_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
