//! The request as the limiter sees it: method, path, host, the client address and read access to the
//! header fields. The fields are read through [`HeaderLookup`], so the proxy can hand over hyper's
//! `HeaderMap` or the raw fields of its HTTP/1.1 parser without copying them into a map first.

use std::{fmt, net::IpAddr, ops::ControlFlow};

use http::{HeaderMap, HeaderName};

/// What the limiter needs to know about a request.
pub struct RequestFacts<'a> {
    /// Request method (`GET`, ...).
    pub method: &'a http::Method,
    /// Request path, without the query.
    pub path: &'a str,
    /// Host without port, lower case, if the request names one.
    pub host: Option<&'a str>,
    /// Request header fields.
    pub headers: &'a dyn HeaderLookup,
    /// The client address (already resolved through trusted proxies, see [`super::client_ip()`]).
    pub client_ip: IpAddr,
}

impl fmt::Debug for RequestFacts<'_> {
    /// Header values are left out: they may hold credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names = Vec::new();
        self.headers.each_name(&mut |n| names.push(n.to_owned()));
        f.debug_struct("RequestFacts")
            .field("method", self.method)
            .field("path", &self.path)
            .field("host", &self.host)
            .field("headers", &names)
            .field("client_ip", &self.client_ip)
            .finish()
    }
}

/// Read access to a request's header fields; names compare case-insensitively.
pub trait HeaderLookup: Sync {
    /// The value of the first field named `name`.
    fn first(&self, name: &HeaderName) -> Option<&[u8]>;
    /// Calls `f` with the value of every field named `name`, last field first, until it breaks.
    fn each_rev<'s>(&'s self, name: &HeaderName, f: &mut dyn FnMut(&'s [u8]) -> ControlFlow<()>);
    /// Calls `f` with every field name (for debug output).
    fn each_name(&self, f: &mut dyn FnMut(&str));
}

impl HeaderLookup for HeaderMap {
    fn first(&self, name: &HeaderName) -> Option<&[u8]> {
        self.get(name).map(|v| v.as_bytes())
    }

    fn each_rev<'s>(&'s self, name: &HeaderName, f: &mut dyn FnMut(&'s [u8]) -> ControlFlow<()>) {
        for v in self.get_all(name).iter().rev() {
            if f(v.as_bytes()).is_break() {
                return;
            }
        }
    }

    fn each_name(&self, f: &mut dyn FnMut(&str)) {
        self.keys().for_each(|k| f(k.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_map_is_read_first_value_first_and_walked_last_value_first() {
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", "1.1.1.1".parse().unwrap());
        h.append("x-forwarded-for", "2.2.2.2".parse().unwrap());
        let name = HeaderName::from_static("x-forwarded-for");
        assert_eq!(h.first(&name), Some(&b"1.1.1.1"[..]));
        let mut seen = Vec::new();
        h.each_rev(&name, &mut |v| {
            seen.push(v);
            ControlFlow::Continue(())
        });
        assert_eq!(seen, [&b"2.2.2.2"[..], &b"1.1.1.1"[..]]);
        assert_eq!(h.first(&HeaderName::from_static("authorization")), None);
    }
}
