//! The HTTP/1.1 fast path's request-head parser, on any bytes a client may send.
//!
//! Properties, beyond "never panics":
//! - a head the fast path takes lies within the bytes it was parsed from, and so do its fields;
//! - its path either is refused (400) or normalizes to a path that normalizes to itself;
//! - the head written to the app parses again as a head the fast path takes, with the same method, the
//!   same target (the normalized path and the query as sent), the same `Host` and the same framing, and
//!   writing that one out again gives the same bytes: the app reads exactly what the limiter read, and
//!   the proxy's own output is a fixpoint of parse-then-write (for heads that stay within the 100 fields
//!   the fast path takes once the proxy's two forwarding fields are added).
#![no_main]

use std::net::{IpAddr, Ipv4Addr};

use libfuzzer_sys::fuzz_target;
use sluice_crds::sidecar_config::{EscapedSlashes, PathsConfig};
use sluice_sidecar::{
    http1::fields::{Field, MAX_FIELDS},
    proxy::{
        h1::{
            encode::{Peer, request_head},
            request::{Parsed, RequestHead, parse},
        },
        target::{check_host, normalize_path},
    },
};

fuzz_target!(|data: &[u8]| {
    // The last byte picks the path settings, so every setting is explored with the same heads.
    let paths = match data.last().map(|b| b % 4) {
        Some(1) => PathsConfig {
            escaped_slashes: EscapedSlashes::Keep,
            ..PathsConfig::default()
        },
        Some(2) => PathsConfig {
            merge_slashes: false,
            ..PathsConfig::default()
        },
        Some(3) => PathsConfig {
            normalize: false,
            merge_slashes: false,
            ..PathsConfig::default()
        },
        _ => PathsConfig::default(),
    };
    let mut fields = Vec::new();
    let head = match parse(data, &mut fields) {
        Parsed::Head(head) => head,
        Parsed::Partial => {
            assert!(data.len() < sluice_sidecar::proxy::h1::request::MAX_HEAD);
            return;
        }
        Parsed::HandOff(_) | Parsed::Refused(..) => return,
    };
    in_bounds(data, &head, &fields);
    assert!(
        check_host(head.host.of(data)).is_ok(),
        "a taken head has a valid Host"
    );

    let raw_path = head.path(data);
    let mut normalized = String::new();
    let Ok(rewritten) = normalize_path(raw_path, &paths, &mut normalized) else {
        return; // answered 400
    };
    let path = if rewritten { normalized.as_str() } else { raw_path };
    let mut again = String::new();
    assert_eq!(
        normalize_path(path, &paths, &mut again),
        Ok(false),
        "{raw_path:?} normalized to {path:?}, which normalizes to {again:?}"
    );

    let peer = Peer::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)));
    let mut out = Vec::new();
    request_head(
        &mut out,
        data,
        &head,
        rewritten.then_some(path),
        &fields,
        &peer,
        false,
    );

    // The proxy adds its two forwarding fields to what the client sent: a head of nearly 100 fields
    // reaches the app with up to 102, more than the fast path (and hyper) take from a client. The app
    // decides about those (hyper answers 431); nothing else is added.
    let written_fields = out.split(|&b| b == b'\n').count() - 3;
    if written_fields > MAX_FIELDS {
        assert!(
            written_fields <= MAX_FIELDS + 2,
            "{written_fields} fields written"
        );
        return;
    }
    let mut fields2 = Vec::new();
    let head2 = match parse(&out, &mut fields2) {
        Parsed::Head(h) => h,
        other => panic!(
            "the head sent to the app is not taken ({other:?}):\n{}",
            String::from_utf8_lossy(&out)
        ),
    };
    in_bounds(&out, &head2, &fields2);
    assert_eq!(head2.len, out.len(), "the written head is one head");
    assert_eq!(head2.method, head.method);
    let query = &head.target.of(data)[head.path_len..];
    assert_eq!(head2.path(&out), path);
    assert_eq!(&head2.target.of(&out)[head2.path_len..], query);
    assert_eq!(head2.host.of(&out), head.host.of(data));
    assert_eq!(head2.framing, head.framing);

    let mut out2 = Vec::new();
    request_head(&mut out2, &out, &head2, None, &fields2, &peer, false);
    assert_eq!(
        String::from_utf8_lossy(&out2),
        String::from_utf8_lossy(&out),
        "writing the written head again changes it"
    );
});

fn in_bounds(buf: &[u8], head: &RequestHead, fields: &[Field]) {
    assert!(head.len <= buf.len());
    assert!(head.target.range().end <= head.len);
    assert!(head.host.range().end <= head.len);
    assert!(head.path_len <= head.target.range().len());
    for f in fields {
        assert!(f.name.range().end <= head.len && f.value.range().end <= head.len);
    }
}
