//! tch-memprof (work in progress)
#![allow(missing_docs)]
mod error;
mod ffi;
pub use error::{Error, Result};
#[doc(hidden)]
pub mod probe {
    //! temporary
    pub use crate::ffi::*;
}
