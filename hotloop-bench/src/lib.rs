//! The measuring tools' reusable parts: the load generator, an HTTP/2 load
//! that reconnects after GOAWAY (`h2_load`, for servers that drain), and the
//! peer servers (the same servers on tokio, monoio, raw system calls and raw io_uring).
//!
//! Not published: the production command is `hotloop-cli`, which links
//! none of this.

pub mod h2_load;
pub mod load;
pub mod peers;

pub use hotloop_proto as proto;
pub use hotloop_proto::hyper_app;
