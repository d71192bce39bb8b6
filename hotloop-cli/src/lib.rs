//! The reusable parts of the `hotloop` command: the wire formats every
//! server in the bench speaks, the load generator and the peer servers.

pub mod hyper_app;
pub mod load;
pub mod peers;
pub mod proto;
