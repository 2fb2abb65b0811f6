use super::bind;

/// `*` listens on every IPv4 and IPv6 address of a dual-stack host (where an IPv6
/// wildcard socket also takes IPv4 unless told not to): both loopbacks answer.
#[tokio::test]
async fn star_listens_on_ipv4_and_ipv6_of_a_dual_stack_host() {
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let listeners = bind(&["*".to_owned()], port)
        .await
        .unwrap_or_else(|(target, e)| panic!("binding {target}: {e}"));
    assert!(!listeners.is_empty());
    for address in [format!("127.0.0.1:{port}"), format!("[::1]:{port}")] {
        tokio::net::TcpStream::connect(&address)
            .await
            .unwrap_or_else(|e| panic!("connecting to {address}: {e}"));
    }
}
