//! The conformance suite: one function per rule, generic over a [`Backend`].
//!
//! Each function takes a fresh, empty directory of its own and panics when
//! the backend breaks the rule. `conformance_suite!` expands each into a
//! `#[test]`.
//!
//! [`Backend`]: crate::Backend

mod apply;
mod browse;
mod delivery;
mod destinations;
mod durability;
mod effects;
pub mod generic;
mod operations;
mod producer;
mod props;
mod receive;
mod relay;

pub use apply::*;
pub use browse::*;
pub use delivery::*;
pub use destinations::*;
pub use durability::*;
pub use effects::*;
pub use generic::*;
pub use operations::*;
pub use producer::*;
pub use props::*;
pub use receive::*;
pub use relay::*;
