//! The pod injection webhook: annotations, the pure patch, and the HTTPS admission server.

pub mod annotations;
pub mod inject;
pub mod server;
