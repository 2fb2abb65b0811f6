//! A primary that accepts the connection and then says nothing (a proxy whose far side is
//! gone, a hung server) fails the attempt within the connect timeout instead of holding it
//! forever.
use std::time::{Duration, Instant};

use config::SourceConnection;
use source::{connect, SourceError};
use testkit::Patience;

#[test]
fn a_primary_that_never_answers_fails_the_connection_in_time() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // Accepts connections and never writes a byte (held until the test ends).
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let conn = SourceConnection::from_uri(&format!(
            "postgresql://u@127.0.0.1:{port}/db?sslmode=disable"
        ))
        .unwrap();
        let started = Instant::now();
        let bound = Patience::of_run().stall;
        let result = tokio::time::timeout(bound, connect(&conn)).await;
        let took = started.elapsed();
        let error = match result {
            Ok(Err(e)) => e,
            Ok(Ok(_)) => panic!("a silent server cannot complete a connection"),
            Err(_) => panic!("the connection attempt was still waiting after {bound:?}"),
        };
        assert!(matches!(error, SourceError::Connection(_)), "{error}");
        assert!(error.to_string().contains("did not complete"), "{error}");
        assert!(took < Duration::from_secs(15), "took {took:?}");
        silent.abort();
    });
}
