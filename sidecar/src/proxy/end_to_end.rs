//! A request's fields as the limiter reads them: only the end-to-end ones, those the app will receive.
//! Hop-by-hop fields and those `Connection` names are skipped ([`dropped`]), so a field the proxy drops
//! cannot pick a rate-limit key. Both paths have their view: [`EndToEnd`] over hyper's header map, and
//! the fast path's [`Fields`] (spans of the read buffer).

use std::ops::ControlFlow;

use http::{HeaderMap, HeaderName, header};

use crate::{
    http1::{fields::Fields, hop_by_hop::dropped},
    limiter::HeaderLookup,
};

/// A request's fields as the app will receive them: lookups skip the fields [`dropped`] on the way.
pub struct EndToEnd<'a>(pub &'a HeaderMap);

impl EndToEnd<'_> {
    fn forwarded(&self, name: &HeaderName) -> bool {
        !dropped(
            name.as_str().as_bytes(),
            self.0.get_all(header::CONNECTION).iter().map(|v| v.as_bytes()),
        )
    }
}

impl HeaderLookup for EndToEnd<'_> {
    fn first(&self, name: &HeaderName) -> Option<&[u8]> {
        if self.forwarded(name) {
            self.0.first(name)
        } else {
            None
        }
    }

    fn each_rev<'s>(&'s self, name: &HeaderName, f: &mut dyn FnMut(&'s [u8]) -> ControlFlow<()>) {
        if self.forwarded(name) {
            self.0.each_rev(name, f);
        }
    }

    fn each_name(&self, f: &mut dyn FnMut(&str)) {
        self.0.each_name(f);
    }
}

impl HeaderLookup for Fields<'_> {
    fn first(&self, name: &HeaderName) -> Option<&[u8]> {
        if self.dropped(name.as_str().as_bytes()) {
            return None;
        }
        self.values(name.as_str()).next()
    }

    fn each_rev<'s>(&'s self, name: &HeaderName, f: &mut dyn FnMut(&'s [u8]) -> ControlFlow<()>) {
        if self.dropped(name.as_str().as_bytes()) {
            return;
        }
        for v in self.values(name.as_str()).rev() {
            if f(v).is_break() {
                return;
            }
        }
    }

    fn each_name(&self, f: &mut dyn FnMut(&str)) {
        for field in self.list {
            f(&String::from_utf8_lossy(field.name.of(self.buf)));
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;
    use crate::http1::fields::{Field, Span};

    #[test]
    fn the_limiter_sees_only_what_the_app_will() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("authorization"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer junk"));
        h.insert(header::HOST, HeaderValue::from_static("a"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        let view = EndToEnd(&h);
        assert_eq!(view.first(&header::AUTHORIZATION), None);
        assert_eq!(view.first(&header::TE), None);
        assert_eq!(view.first(&header::HOST), Some(&b"a"[..]));
    }

    #[test]
    fn fields_are_found_in_any_case_first_and_last() {
        let buf = b"X-Forwarded-For: 1.1.1.1\r\nhost: a\r\nx-forwarded-for: 2.2.2.2\r\n";
        let text = std::str::from_utf8(buf).unwrap();
        let mut list = Vec::new();
        for line in text.split("\r\n").filter(|l| !l.is_empty()) {
            let (name, value) = line.split_once(": ").unwrap();
            list.push(Field {
                name: Span::within(buf, name.as_bytes()),
                value: Span::within(buf, value.as_bytes()),
            });
        }
        let fields = Fields::new(buf, &list);
        let xff = HeaderName::from_static("x-forwarded-for");
        assert_eq!(fields.first(&xff), Some(&b"1.1.1.1"[..]));
        let mut seen = Vec::new();
        fields.each_rev(&xff, &mut |v| {
            seen.push(v);
            ControlFlow::Continue(())
        });
        assert_eq!(seen, [&b"2.2.2.2"[..], &b"1.1.1.1"[..]]);
        assert_eq!(fields.first(&http::header::AUTHORIZATION), None);
    }

    #[test]
    fn fields_dropped_on_the_way_are_not_read() {
        let buf = b"Connection: authorization\r\nAuthorization: Bearer junk\r\nTE: trailers\r\nHost: a\r\n";
        let text = std::str::from_utf8(buf).unwrap();
        let list: Vec<Field> = text
            .split("\r\n")
            .filter(|l| !l.is_empty())
            .map(|line| {
                let (name, value) = line.split_once(": ").unwrap();
                Field {
                    name: Span::within(buf, name.as_bytes()),
                    value: Span::within(buf, value.as_bytes()),
                }
            })
            .collect();
        let fields = Fields::new(buf, &list);
        assert_eq!(fields.first(&http::header::AUTHORIZATION), None);
        assert_eq!(fields.first(&http::header::TE), None);
        assert_eq!(fields.first(&http::header::HOST), Some(&b"a"[..]));
    }
}
