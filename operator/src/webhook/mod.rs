//! The admission webhooks: pod injection (annotations, the pure patch), the JobQueue access check, and
//! the HTTPS admission server.

pub mod annotations;
pub mod inject;
pub mod job_queue_access;
pub mod server;
