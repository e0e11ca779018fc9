//! Key derivation: which counter a request counts against.
//!
//! A rule's key parts (client IP masked to a prefix, headers, method, path) are fed, length-prefixed, into
//! HMAC-SHA-256 keyed with the counter key (`SLUICE_COUNTER_KEY`; plain SHA-256 without one) together
//! with the namespace, policy and rule name; the first 16 bytes name the counter. So the Redis key has a
//! fixed length, carries no raw header value or credential — and, keyed, cannot be tested against
//! guesses of one by whoever reads Redis's key names without the key — and depends only on (namespace,
//! policy, rule, key value, counter key) plus the window length — never on limit values or rule order,
//! so a limit change keeps its counters. Redis keys look like
//! `sluice:{<namespace>/<policy>/<rule>/<32 hex digits>}:<algorithm>:<window ms>[:<window index>]`;
//! the braces are a Redis Cluster hash tag, so every key of one counter lives in one slot.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::HeaderName;
use ring::hmac;
use sha2::{Digest, Sha256};
use sluice_crds::sidecar_config::{KeyPart, KeySource, PolicyRef};

use super::{RequestFacts, client_ip::unmap};
use crate::{Error, Result};

/// Header hashed by `credential` key parts unless the rule names another.
pub const CREDENTIAL_HEADER_DEFAULT: &str = "authorization";

/// 128 bits of HMAC-SHA-256 (or SHA-256): the identity of one counter (rule and key value).
pub type KeyHash = [u8; 16];

/// A key hash in the making: HMAC-SHA-256 keyed with the counter key, or SHA-256 without one.
#[derive(Clone)]
enum Hasher {
    Plain(Sha256),
    Keyed(hmac::Context),
}

impl Hasher {
    fn new(counter_key: Option<&hmac::Key>) -> Self {
        match counter_key {
            Some(key) => Self::Keyed(hmac::Context::with_key(key)),
            None => Self::Plain(Sha256::new()),
        }
    }

    fn update(&mut self, bytes: impl AsRef<[u8]>) {
        match self {
            Self::Plain(h) => h.update(bytes),
            Self::Keyed(h) => h.update(bytes.as_ref()),
        }
    }

    fn finish(self) -> KeyHash {
        let mut out = [0u8; 16];
        match self {
            Self::Plain(h) => out.copy_from_slice(&h.finalize()[..16]),
            Self::Keyed(h) => out.copy_from_slice(&h.sign().as_ref()[..16]),
        }
        out
    }
}

impl std::fmt::Debug for Hasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Plain(_) => "Hasher::Plain",
            Self::Keyed(_) => "Hasher::Keyed",
        })
    }
}

/// One compiled key part.
#[derive(Debug, Clone)]
enum Part {
    ClientIp {
        v4: u8,
        v6: u8,
    },
    Header(HeaderName),
    HashedHeader(HeaderName),
    Credential {
        header: HeaderName,
        v4: u8,
        v6: u8,
    },
    Method,
    Path,
    /// Adds nothing to the key, but the rule applies only when the header is present (a ceiling per
    /// client IP applies when its rule counted a value the client picked).
    Present(HeaderName),
}

/// Suffix of the rule name a rule's ceiling per client IP counts under (`write/client-ip`): no rule
/// name holds a `/`, so it cannot meet another rule's counters.
pub const CEILING_SUFFIX: &str = "/client-ip";

/// How one rule derives keys from requests.
#[derive(Debug, Clone)]
pub struct KeySpec {
    /// The hash with the rule's namespace, policy and name fed in: every key hash of the rule starts
    /// from (a copy of) it.
    start: Hasher,
    /// The first 8 bytes of SHA-256 of the rule's namespace, policy and name (see [`KeySpec::scope_id`]).
    scope_id: u64,
    /// `sluice:{ns/policy/rule/`, the readable start of every Redis key of the rule.
    redis_prefix: String,
    parts: Vec<Part>,
}

impl KeySpec {
    /// Compiles the key of rule `rule` (at `field`, e.g. `limits.rules[2]`), its hashes keyed with
    /// `counter_key` (unkeyed SHA-256 without one).
    pub fn compile(
        policy: Option<&PolicyRef>,
        rule: &str,
        parts: &[KeyPart],
        field: &str,
        counter_key: Option<&hmac::Key>,
    ) -> Result<Self> {
        let (ns, name) = policy.map_or(("-", "-"), |p| (p.namespace.as_str(), p.name.as_str()));
        let mut scope = Vec::new();
        for s in [ns, name, rule] {
            scope.extend_from_slice(&(s.len() as u64).to_be_bytes());
            scope.extend_from_slice(s.as_bytes());
        }
        let redis_prefix = sluice_crds::contract::redis::rule_key_prefix(ns, name, rule);
        let parts = if parts.is_empty() {
            vec![Part::ClientIp { v4: 32, v6: 64 }]
        } else {
            parts
                .iter()
                .enumerate()
                .map(|(j, p)| compile_part(p, &format!("{field}.key[{j}]")))
                .collect::<Result<_>>()?
        };
        let scope_id = u64::from_be_bytes(
            Sha256::digest(&scope)[..8]
                .try_into()
                .expect("a SHA-256 digest has 8 bytes"),
        );
        let mut start = Hasher::new(counter_key);
        start.update(&scope);
        Ok(Self {
            start,
            scope_id,
            redis_prefix,
            parts,
        })
    }

    /// The key of the ceiling per client IP of a rule keyed by `parts` (see [`CEILING_SUFFIX`]): the
    /// client IP, grouped by the prefixes of the rule's `credential` part (or the defaults), counted
    /// only for requests that carry the headers the rule's key read.
    pub fn ceiling(
        policy: Option<&PolicyRef>,
        rule: &str,
        parts: &[KeyPart],
        field: &str,
        counter_key: Option<&hmac::Key>,
    ) -> Result<Self> {
        let mut present = Vec::new();
        let mut ip = KeyPart::client_ip();
        for (j, p) in parts.iter().enumerate() {
            match compile_part(p, &format!("{field}.key[{j}]"))? {
                Part::Header(name) | Part::HashedHeader(name) => present.push(Part::Present(name)),
                Part::Credential { header, v4, v6 } => {
                    present.push(Part::Present(header));
                    (ip.ipv4_prefix, ip.ipv6_prefix) = (v4, v6);
                }
                _ => {}
            }
        }
        let mut spec = Self::compile(
            policy,
            &format!("{rule}{CEILING_SUFFIX}"),
            &[ip],
            field,
            counter_key,
        )?;
        spec.parts.extend(present);
        Ok(spec)
    }

    /// A fixed id of the rule (64 bits of SHA-256 of its namespace, policy and name; a ceiling has its
    /// own), computed once at config load: the same across reloads, and made of names from the operator's
    /// config, never of request values, so no client can aim two rules at one id.
    pub fn scope_id(&self) -> u64 {
        self.scope_id
    }

    /// The key hash of `req`, or `None` when a header the key needs is missing (the rule does not apply).
    /// A header sent several times counts with all its values: an app may read another one than the first.
    pub fn hash(&self, req: &RequestFacts<'_>) -> Option<KeyHash> {
        let mut h = self.start.clone();
        for part in &self.parts {
            match part {
                Part::ClientIp { v4, v6 } => feed_ip(&mut h, b'i', masked(req.client_ip, *v4, *v6)),
                Part::Header(name) => feed_all(&mut h, b'h', req, name).then_some(())?,
                Part::HashedHeader(name) => feed_all(&mut h, b'x', req, name).then_some(())?,
                Part::Credential { header, v4, v6 } => {
                    if !feed_all(&mut h, b'x', req, header) {
                        feed_ip(&mut h, b'i', masked(req.client_ip, *v4, *v6));
                    }
                }
                Part::Method => feed(&mut h, b'm', req.method.as_str().as_bytes()),
                Part::Path => feed(&mut h, b'p', req.path.as_bytes()),
                Part::Present(name) => req.headers.first(name).map(drop)?,
            }
        }
        Some(h.finish())
    }

    /// `sluice:{ns/policy/rule/<hex>}`: the start of every Redis key of this counter.
    pub fn redis_base(&self, hash: &KeyHash) -> String {
        let mut s = String::with_capacity(self.redis_prefix.len() + 33 + 24);
        s.push_str(&self.redis_prefix);
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for b in hash {
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        s.push('}');
        s
    }
}

fn compile_part(p: &KeyPart, field: &str) -> Result<Part> {
    if p.ipv4_prefix > 32 {
        return Err(Error::Config(format!(
            "{field}.ipv4Prefix: {} is longer than 32",
            p.ipv4_prefix
        )));
    }
    if p.ipv6_prefix > 128 {
        return Err(Error::Config(format!(
            "{field}.ipv6Prefix: {} is longer than 128",
            p.ipv6_prefix
        )));
    }
    let header = |default: Option<&str>| -> Result<HeaderName> {
        let name = p.name.as_deref().or(default).ok_or_else(|| {
            Error::Config(format!(
                "{field}.name: a {:?} key part needs a header name",
                p.source
            ))
        })?;
        HeaderName::try_from(name)
            .map_err(|_| Error::Config(format!("{field}.name: {name:?} is not a header name")))
    };
    Ok(match p.source {
        KeySource::ClientIp => Part::ClientIp {
            v4: p.ipv4_prefix,
            v6: p.ipv6_prefix,
        },
        KeySource::Header => Part::Header(header(None)?),
        KeySource::HashedHeader => Part::HashedHeader(header(None)?),
        KeySource::Credential => Part::Credential {
            header: header(Some(CREDENTIAL_HEADER_DEFAULT))?,
            v4: p.ipv4_prefix,
            v6: p.ipv6_prefix,
        },
        KeySource::Method => Part::Method,
        KeySource::Path => Part::Path,
    })
}

/// The client address grouped by prefix: IPv4-mapped addresses are unwrapped first, then IPv4 addresses
/// keep their first `v4` bits and IPv6 addresses their first `v6` bits (a /64 by default).
pub fn masked(ip: IpAddr, v4: u8, v6: u8) -> (IpAddr, u8) {
    match unmap(ip) {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(v4.min(32))).unwrap_or(0);
            (IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask)), v4.min(32))
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(v6.min(128))).unwrap_or(0);
            (IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask)), v6.min(128))
        }
    }
}

/// Feeds every value of the field `name` (last first); whether there was one.
///
/// One value is fed as one item (tag, length, bytes), as before repeated fields were told apart, so the
/// common single-valued key keeps its counter. Several values are fed after [`LIST_TAG`] and their
/// count: without it, a value could move from the end of one repeated key header to the start of the
/// next part fed under the same tag (`A: x, A: y, B: z` and `A: y, B: z, B: x` both fed `y`, `x`, `z`) and
/// two different requests shared a counter. With it, each part's encoding opens with a byte saying how
/// many items follow (a value tag: one; [`LIST_TAG`]: the count after it), so the rule's parts, known in
/// advance, read back from the bytes in one way only.
fn feed_all(h: &mut Hasher, tag: u8, req: &RequestFacts<'_>, name: &HeaderName) -> bool {
    // Values are walked last first: the first one seen is the last field's.
    let (mut count, mut first_seen) = (0u64, None);
    req.headers.each_rev(name, &mut |v| {
        count += 1;
        first_seen.get_or_insert(v);
        std::ops::ControlFlow::Continue(())
    });
    let Some(value) = first_seen else {
        return false;
    };
    if count == 1 {
        feed(h, tag, value);
    } else {
        h.update([LIST_TAG]);
        h.update(count.to_be_bytes());
        req.headers.each_rev(name, &mut |v| {
            feed(h, tag, v);
            std::ops::ControlFlow::Continue(())
        });
    }
    true
}

/// Opens the items of a key header sent several times (see [`feed_all`]); no value is fed under it.
const LIST_TAG: u8 = b'n';

fn feed(h: &mut Hasher, tag: u8, value: &[u8]) {
    h.update([tag]);
    h.update((value.len() as u64).to_be_bytes());
    h.update(value);
}

fn feed_ip(h: &mut Hasher, tag: u8, (ip, prefix): (IpAddr, u8)) {
    match ip {
        IpAddr::V4(a) => {
            feed(h, tag, &a.octets());
        }
        IpAddr::V6(a) => {
            feed(h, tag, &a.octets());
        }
    }
    h.update([prefix]);
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, Method};

    use super::*;

    fn facts<'a>(ip: &str, headers: &'a HeaderMap, method: &'a Method, path: &'a str) -> RequestFacts<'a> {
        RequestFacts {
            method,
            path,
            host: None,
            headers,
            client_ip: ip.parse().unwrap(),
        }
    }

    fn spec(parts: &[KeyPart]) -> KeySpec {
        let policy = PolicyRef {
            namespace: "shop".into(),
            name: "api".into(),
            generation: 1,
        };
        KeySpec::compile(Some(&policy), "read", parts, "limits.rules[0]", None).unwrap()
    }

    fn hash_of(s: &KeySpec, ip: &str, headers: &HeaderMap) -> Option<KeyHash> {
        s.hash(&facts(ip, headers, &Method::GET, "/x"))
    }

    #[test]
    fn ipv6_clients_in_one_slash_64_share_a_key() {
        let s = spec(&[]);
        let h = HeaderMap::new();
        let a = hash_of(&s, "2001:db8:1:2:aaaa::1", &h);
        assert_eq!(a, hash_of(&s, "2001:db8:1:2:ffff:ffff:ffff:ffff", &h));
        assert_ne!(a, hash_of(&s, "2001:db8:1:3::1", &h));
    }

    #[test]
    fn ipv4_mapped_addresses_count_as_their_ipv4_address() {
        let s = spec(&[]);
        let h = HeaderMap::new();
        assert_eq!(
            hash_of(&s, "::ffff:198.51.100.7", &h),
            hash_of(&s, "198.51.100.7", &h)
        );
        assert_ne!(hash_of(&s, "198.51.100.7", &h), hash_of(&s, "198.51.100.8", &h));
    }

    #[test]
    fn prefix_lengths_are_configurable() {
        let s = spec(&[KeyPart {
            ipv4_prefix: 24,
            ipv6_prefix: 48,
            ..KeyPart::client_ip()
        }]);
        let h = HeaderMap::new();
        assert_eq!(hash_of(&s, "198.51.100.7", &h), hash_of(&s, "198.51.100.200", &h));
        assert_eq!(
            hash_of(&s, "2001:db8:1:2::1", &h),
            hash_of(&s, "2001:db8:1:ffff::1", &h)
        );
        assert_eq!(
            masked("10.1.2.3".parse().unwrap(), 0, 0).0,
            "0.0.0.0".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn credential_keys_hash_the_header_and_fall_back_to_the_client_ip() {
        let s = spec(&[KeyPart {
            source: KeySource::Credential,
            ..KeyPart::client_ip()
        }]);
        let mut alice = HeaderMap::new();
        alice.insert("authorization", "Bearer alice-secret".parse().unwrap());
        let from_a = hash_of(&s, "198.51.100.7", &alice).unwrap();
        assert_eq!(
            Some(from_a),
            hash_of(&s, "203.0.113.1", &alice),
            "same token, any address"
        );
        assert_ne!(Some(from_a), hash_of(&s, "198.51.100.7", &HeaderMap::new()));
        let base = s.redis_base(&from_a);
        assert!(!base.contains("alice"), "{base}");
        assert!(
            base.starts_with("sluice:{shop/api/read/") && base.ends_with('}'),
            "{base}"
        );
        assert_eq!(base.len(), "sluice:{shop/api/read/}".len() + 32);
    }

    #[test]
    fn a_repeated_key_header_counts_with_every_value() {
        let s = spec(&[KeyPart {
            source: KeySource::Credential,
            ..KeyPart::client_ip()
        }]);
        let mut valid = HeaderMap::new();
        valid.append("authorization", "Bearer valid".parse().unwrap());
        let mut junk_first = HeaderMap::new();
        junk_first.append("authorization", "Bearer junk".parse().unwrap());
        junk_first.append("authorization", "Bearer valid".parse().unwrap());
        assert_ne!(
            hash_of(&s, "198.51.100.7", &valid),
            hash_of(&s, "198.51.100.7", &junk_first),
            "an app reading the last value would serve the valid one on the junk one's bucket"
        );
    }

    fn hex(h: KeyHash) -> String {
        h.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A rule keyed by two client-picked headers, `x-tenant` then `x-user`.
    fn two_headers() -> KeySpec {
        let header = |name: &str| KeyPart {
            source: KeySource::Header,
            name: Some(name.into()),
            ..KeyPart::client_ip()
        };
        spec(&[header("x-tenant"), header("x-user")])
    }

    fn fields(list: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in list {
            h.append(*name, value.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_value_cannot_move_from_one_repeated_key_header_to_the_next() {
        let s = two_headers();
        let ip = "198.51.100.7";
        // Values are walked last first: before, both fed `b`, `a`, `c` in a row.
        let one = fields(&[("x-tenant", "a"), ("x-tenant", "b"), ("x-user", "c")]);
        let other = fields(&[("x-tenant", "b"), ("x-user", "c"), ("x-user", "a")]);
        assert_ne!(hash_of(&s, ip, &one), hash_of(&s, ip, &other));
        // Nor from a credential to the header after it.
        let s = spec(&[
            KeyPart {
                source: KeySource::Credential,
                ..KeyPart::client_ip()
            },
            KeyPart {
                source: KeySource::HashedHeader,
                name: Some("x-api-key".into()),
                ..KeyPart::client_ip()
            },
        ]);
        let one = fields(&[("authorization", "a"), ("authorization", "b"), ("x-api-key", "c")]);
        let other = fields(&[("authorization", "b"), ("x-api-key", "c"), ("x-api-key", "a")]);
        assert_ne!(hash_of(&s, ip, &one), hash_of(&s, ip, &other));
    }

    #[test]
    fn a_list_in_one_field_is_another_key_than_the_same_values_in_several() {
        let s = two_headers();
        let ip = "198.51.100.7";
        let keys = [
            fields(&[("x-tenant", "a,b"), ("x-user", "c")]),
            fields(&[("x-tenant", "a"), ("x-tenant", "b"), ("x-user", "c")]),
            fields(&[("x-tenant", "b"), ("x-tenant", "a"), ("x-user", "c")]),
            fields(&[("x-tenant", "a"), ("x-user", "b,c")]),
            fields(&[("x-tenant", "a,"), ("x-user", "b,c")]),
            fields(&[("x-tenant", "a"), ("x-user", ",b,c")]),
            // Fed the same items as the second (`b`, `a`, `c`) before the values of a repeated header
            // were hashed with their count: the one pair here that guards that change, the others were
            // told apart by the values' lengths already.
            fields(&[("x-tenant", "b"), ("x-user", "c"), ("x-user", "a")]),
        ]
        .map(|h| hash_of(&s, ip, &h).unwrap());
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b, "{keys:?}");
            }
        }
    }

    #[test]
    fn single_valued_keys_are_the_same_as_before_repeated_headers_were_told_apart() {
        // Pinned: a changed key starts fresh counters on upgrade.
        let ip = "198.51.100.7";
        let credential = spec(&[KeyPart {
            source: KeySource::Credential,
            ..KeyPart::client_ip()
        }]);
        let hashed_with_route = spec(&[
            KeyPart {
                source: KeySource::HashedHeader,
                name: Some("x-api-key".into()),
                ..KeyPart::client_ip()
            },
            KeyPart {
                source: KeySource::Method,
                ..KeyPart::client_ip()
            },
            KeyPart {
                source: KeySource::Path,
                ..KeyPart::client_ip()
            },
        ]);
        let keys = [
            hash_of(
                &two_headers(),
                ip,
                &fields(&[("x-tenant", "acme"), ("x-user", "alice")]),
            ),
            hash_of(&credential, ip, &fields(&[("authorization", "Bearer alice")])),
            hash_of(&credential, ip, &HeaderMap::new()),
            hash_of(&hashed_with_route, ip, &fields(&[("x-api-key", "k-1")])),
        ]
        .map(|h| hex(h.unwrap()));
        assert_eq!(
            keys,
            [
                "4eb718d31d5e0f177ea208822038c23f",
                "14db72417962335c5367c2ca129986fe",
                "64cd8a0fbd56d832f549867a22c9d96a",
                "730eaad8cd996725160eb31d37d0ca3f"
            ]
        );
    }

    #[test]
    fn a_repeated_key_header_hashes_as_pinned() {
        // Pinned: a change to how repeated values are fed (list tag, count, values last first) would
        // move every client that repeats a key header to fresh counters on upgrade, and no other test
        // would notice. The value is what this encoding computes, not worked out independently: it
        // guards the layout against change, it does not prove it right.
        let key = hash_of(
            &two_headers(),
            "198.51.100.7",
            &fields(&[("x-tenant", "a"), ("x-tenant", "b"), ("x-user", "c")]),
        );
        assert_eq!(hex(key.unwrap()), "28563ed6456efb5a97163241f8832d48");
    }

    #[test]
    fn a_counter_key_makes_the_name_an_hmac_of_the_same_bytes() {
        // The bytes a credential key feeds: the scope (namespace, policy, rule, each length-prefixed),
        // then the header's value under its tag.
        let mut bytes = Vec::new();
        for s in ["shop", "api", "read"] {
            bytes.extend((s.len() as u64).to_be_bytes());
            bytes.extend(s.as_bytes());
        }
        bytes.push(b'x');
        bytes.extend(12u64.to_be_bytes());
        bytes.extend(b"Bearer alice");
        let policy = PolicyRef {
            namespace: "shop".into(),
            name: "api".into(),
            generation: 1,
        };
        let parts = [KeyPart {
            source: KeySource::Credential,
            ..KeyPart::client_ip()
        }];
        let with = |key: Option<&hmac::Key>| {
            let spec = KeySpec::compile(Some(&policy), "read", &parts, "limits.rules[0]", key).unwrap();
            let headers = fields(&[("authorization", "Bearer alice")]);
            hash_of(&spec, "198.51.100.7", &headers).unwrap()
        };
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"0123456789abcdef0123456789abcdef");
        let other = hmac::Key::new(hmac::HMAC_SHA256, b"0123456789abcdef0123456789abcdeF");
        assert_eq!(
            with(None)[..],
            Sha256::digest(&bytes)[..16],
            "unkeyed: SHA-256 as before"
        );
        assert_eq!(with(Some(&key))[..], hmac::sign(&key, &bytes).as_ref()[..16]);
        assert_eq!(with(Some(&key)), with(Some(&key)), "one key, one name");
        assert_ne!(with(Some(&key)), with(Some(&other)));
    }

    #[test]
    fn a_ceiling_counts_per_client_ip_whatever_token_and_only_with_one() {
        let policy = PolicyRef {
            namespace: "shop".into(),
            name: "api".into(),
            generation: 1,
        };
        let parts = [KeyPart {
            source: KeySource::Credential,
            ipv4_prefix: 24,
            ..KeyPart::client_ip()
        }];
        let c = KeySpec::ceiling(Some(&policy), "write", &parts, "limits.rules[0]", None).unwrap();
        let token = |t: &str| {
            let mut h = HeaderMap::new();
            h.insert("authorization", t.parse().unwrap());
            h
        };
        let a = hash_of(&c, "198.51.100.7", &token("Bearer a")).unwrap();
        assert_eq!(
            Some(a),
            hash_of(&c, "198.51.100.9", &token("Bearer b")),
            "same /24, any token"
        );
        assert_ne!(Some(a), hash_of(&c, "203.0.113.7", &token("Bearer a")));
        assert_eq!(
            hash_of(&c, "198.51.100.7", &HeaderMap::new()),
            None,
            "no token: the rule keys by IP already"
        );
        assert!(c.redis_base(&a).starts_with("sluice:{shop/api/write/client-ip/"));
    }

    #[test]
    fn header_keys_do_not_apply_without_the_header() {
        let s = spec(&[KeyPart {
            source: KeySource::Header,
            name: Some("x-tenant".into()),
            ..KeyPart::client_ip()
        }]);
        assert_eq!(hash_of(&s, "198.51.100.7", &HeaderMap::new()), None);
    }

    #[test]
    fn key_parts_are_named_when_invalid() {
        let bad = KeyPart {
            source: KeySource::Header,
            name: None,
            ..KeyPart::client_ip()
        };
        let err =
            KeySpec::compile(None, "r", &[KeyPart::client_ip(), bad], "limits.rules[3]", None).unwrap_err();
        assert!(err.to_string().contains("limits.rules[3].key[1].name"), "{err}");
        let bad = KeyPart {
            ipv6_prefix: 129,
            ..KeyPart::client_ip()
        };
        let err = KeySpec::compile(None, "r", &[bad], "limits.rules[0]", None).unwrap_err();
        assert!(
            err.to_string().contains("limits.rules[0].key[0].ipv6Prefix"),
            "{err}"
        );
    }

    #[test]
    fn braces_in_rule_names_cannot_break_the_hash_tag() {
        let s = KeySpec::compile(None, "a}b{", &[], "limits.rules[0]", None).unwrap();
        let base = s.redis_base(&[0; 16]);
        assert_eq!(base.matches('{').count(), 1);
        assert_eq!(base.matches('}').count(), 1);
    }
}
