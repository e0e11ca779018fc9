//! Which address a request comes from. The socket peer is the client unless the peer is a trusted proxy;
//! only then does `X-Forwarded-For` count, read from the right, skipping trusted proxies. Anything a client
//! writes into the header itself ends up left of the first untrusted hop and is never believed.

use std::{
    net::{IpAddr, SocketAddr},
    ops::ControlFlow,
};

use http::HeaderName;
use ipnet::IpNet;

use super::HeaderLookup;

/// The header proxies append the address they received a request from to.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Resolves the client address: the socket `peer`, or — only when the peer is in `trusted` — the rightmost
/// `X-Forwarded-For` address that is not itself in `trusted`. IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`)
/// are unwrapped to IPv4 first. When every listed hop is trusted, the leftmost one is the client; an
/// unparsable entry stops the walk at the last address that was understood.
pub fn client_ip(peer: IpAddr, headers: &dyn HeaderLookup, trusted: &[IpNet]) -> IpAddr {
    let peer = unmap(peer);
    if !is_trusted(peer, trusted) {
        return peer;
    }
    let mut client = peer;
    // Later header lines were appended later: walk the lines and their entries right to left.
    headers.each_rev(&X_FORWARDED_FOR, &mut |line| {
        let Ok(line) = std::str::from_utf8(line) else {
            return ControlFlow::Break(());
        };
        for entry in line.rsplit(',') {
            let entry = entry.trim();
            if entry.is_empty() {
                continue;
            }
            let Some(addr) = parse_entry(entry) else {
                return ControlFlow::Break(());
            };
            client = unmap(addr);
            if !is_trusted(client, trusted) {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    });
    client
}

/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) as the IPv4 address they carry.
pub fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn is_trusted(ip: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|net| net.contains(&ip))
}

/// An address as proxies write it: `1.2.3.4`, `1.2.3.4:567`, `2001:db8::1`, `[2001:db8::1]:567`.
fn parse_entry(entry: &str) -> Option<IpAddr> {
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| {
            entry
                .strip_prefix('[')
                .and_then(|e| e.strip_suffix(']'))
                .and_then(|e| e.parse().ok())
        })
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(X_FORWARDED_FOR.clone(), v.parse().unwrap());
        }
        h
    }

    fn nets(n: &[&str]) -> Vec<IpNet> {
        n.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn spoofed_forwarded_for_from_an_untrusted_peer_is_ignored() {
        let got = client_ip(ip("198.51.100.7"), &xff(&["1.2.3.4"]), &nets(&["10.0.0.0/8"]));
        assert_eq!(got, ip("198.51.100.7"));
        let got = client_ip(ip("198.51.100.7"), &xff(&["1.2.3.4"]), &[]);
        assert_eq!(got, ip("198.51.100.7"));
    }

    #[test]
    fn trusted_proxy_chain_yields_the_rightmost_untrusted_address() {
        let trusted = nets(&["10.0.0.0/8"]);
        // The client claims to be 1.2.3.4; the edge proxy 10.0.0.5 saw 203.0.113.9.
        let h = xff(&["1.2.3.4, 203.0.113.9", "10.0.0.5"]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &trusted), ip("203.0.113.9"));
    }

    #[test]
    fn all_trusted_hops_yield_the_leftmost_and_garbage_stops_the_walk() {
        let trusted = nets(&["10.0.0.0/8"]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &xff(&["10.0.0.9, 10.0.0.5"]), &trusted),
            ip("10.0.0.9")
        );
        assert_eq!(
            client_ip(
                ip("10.0.0.1"),
                &xff(&["203.0.113.9, nonsense, 10.0.0.5"]),
                &trusted
            ),
            ip("10.0.0.5")
        );
        assert_eq!(
            client_ip(ip("10.0.0.1"), &HeaderMap::new(), &trusted),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn entries_with_ports_and_brackets_parse() {
        let trusted = nets(&["10.0.0.0/8"]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &xff(&["203.0.113.9:4711"]), &trusted),
            ip("203.0.113.9")
        );
        assert_eq!(
            client_ip(ip("10.0.0.1"), &xff(&["[2001:db8::1]:4711"]), &trusted),
            ip("2001:db8::1")
        );
        assert_eq!(
            client_ip(ip("10.0.0.1"), &xff(&["[2001:db8::2]"]), &trusted),
            ip("2001:db8::2")
        );
    }

    #[test]
    fn mapped_ipv4_peers_and_entries_are_unwrapped() {
        let trusted = nets(&["10.0.0.0/8"]);
        assert_eq!(
            client_ip(ip("::ffff:198.51.100.7"), &HeaderMap::new(), &trusted),
            ip("198.51.100.7")
        );
        // A mapped trusted peer is still trusted.
        assert_eq!(
            client_ip(ip("::ffff:10.0.0.1"), &xff(&["::ffff:203.0.113.9"]), &trusted),
            ip("203.0.113.9")
        );
    }
}
