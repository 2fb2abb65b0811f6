//! Where JWKS fetches may not connect (`client_auth.jwks_reject_ip_ranges`,
//! `block_local_jwks`), as the official service decides it: the host's first resolved
//! address is checked, and the fetch connects to that very address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Addresses a JWKS fetch refuses.
#[derive(Debug, Clone, Default)]
pub(crate) struct AddressPolicy {
    nets: Vec<IpNet>,
    /// `local`: every address that is not public unicast.
    local: bool,
    /// `block_local_jwks`: every IPv6 address.
    ipv6: bool,
}

impl AddressPolicy {
    /// From the configured ranges (CIDR, or `local`) and whether IPv6 is refused.
    pub(crate) fn new(ranges: &[String], ipv6: bool) -> Result<Self, String> {
        let mut policy = Self {
            ipv6,
            ..Self::default()
        };
        for range in ranges {
            if range == "local" {
                policy.local = true;
            } else {
                let net = range
                    .parse::<IpNet>()
                    .map_err(|e| format!("`{range}` is not a CIDR range ({e})"))?;
                policy.nets.push(net);
            }
        }
        Ok(policy)
    }

    /// True when nothing is refused (the fetch connects by name, as before).
    pub(crate) fn is_open(&self) -> bool {
        self.nets.is_empty() && !self.local && !self.ipv6
    }

    /// Whether a fetch may connect to `ip`; the error says which setting refuses it.
    pub(crate) fn check(&self, ip: IpAddr) -> Result<(), String> {
        if self.ipv6 && ip.is_ipv6() {
            return Err(format!(
                "{ip} is an IPv6 address, which client_auth.block_local_jwks refuses"
            ));
        }
        if let Some(net) = self.nets.iter().find(|net| net.contains(&ip)) {
            return Err(format!(
                "{ip} is in {net}, which client_auth.jwks_reject_ip_ranges refuses"
            ));
        }
        if self.local && !is_public_unicast(ip) {
            return Err(format!(
                "{ip} is not a public unicast address, which `local` (client_auth.block_local_jwks \
                 or jwks_reject_ip_ranges) refuses"
            ));
        }
        Ok(())
    }
}

/// Not loopback, private, link-local, shared (carrier-grade NAT), multicast, broadcast,
/// documentation, benchmarking or otherwise reserved.
fn is_public_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && c == 0)
        || (a == 198 && (18..20).contains(&b))
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let segments = ip.segments();
    let first = segments[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local
        || (first & 0xffc0) == 0xfe80 // link-local
        || (first == 0x2001 && segments[1] == 0x0db8) // documentation
        || (first == 0x2001 && segments[1] == 0x0002 && segments[2] == 0) // benchmarking
        || (first == 0x2001 && segments[1] < 0x0200) // Teredo, ORCHID and other IETF ranges
        || first == 0x2002 // 6to4
        || (first == 0x0064 && segments[1] == 0xff9b)) // NAT64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(ranges: &[&str], ipv6: bool) -> AddressPolicy {
        let ranges: Vec<String> = ranges.iter().map(|r| (*r).to_owned()).collect();
        AddressPolicy::new(&ranges, ipv6).unwrap()
    }

    #[test]
    fn local_refuses_every_address_that_is_not_public_unicast() {
        let local = policy(&["local"], false);
        for refused in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "192.0.2.1",
            "198.18.0.1",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "2001:db8::1",
        ] {
            assert!(local.check(refused.parse().unwrap()).is_err(), "{refused}");
        }
        for allowed in ["8.8.8.8", "104.16.0.1", "2606:4700::1111", "::ffff:1.1.1.1"] {
            assert!(local.check(allowed.parse().unwrap()).is_ok(), "{allowed}");
        }
    }

    #[test]
    fn ranges_and_ipv6_are_refused_with_the_setting_named() {
        let ranges = policy(&["10.0.0.0/8", "2606:4700::/32"], false);
        let error = ranges.check("10.9.9.9".parse().unwrap()).unwrap_err();
        assert!(error.contains("jwks_reject_ip_ranges"), "{error}");
        assert!(ranges.check("2606:4700::1111".parse().unwrap()).is_err());
        assert!(ranges.check("127.0.0.1".parse().unwrap()).is_ok());
        let no_v6 = policy(&[], true);
        let error = no_v6.check("2606:4700::1111".parse().unwrap()).unwrap_err();
        assert!(error.contains("block_local_jwks"), "{error}");
        assert!(!no_v6.is_open());
        assert!(policy(&[], false).is_open());
        let ranges: Vec<String> = vec!["10.0.0.0/40".into()];
        assert!(AddressPolicy::new(&ranges, false).is_err());
    }
}
