//! Leadership: every replica serves webhooks, only the holder of the Lease reconciles
//! ([`lease`]), and every write it makes is fenced by that leadership as its own clock sees it
//! ([`fence`]).

pub mod fence;
pub mod lease;
