//! `relay --to URL`: the HTTP client transport, built from the flags.

use std::time::Duration;

use ordo_http::{ClientOptions, HttpTransport, KeyRing, Signer};

use crate::args::RelayArgs;
use crate::Failure;

/// The transport to `--to`, signing with `--key-id`/`--key-file` when
/// given. Every flag is checked before a store is opened.
pub fn transport(args: &RelayArgs) -> Result<HttpTransport, Failure> {
    let url = args.to.as_deref().expect("--to or --consumer is required");
    let signer = match (&args.key_id, &args.key_file) {
        (Some(key_id), Some(path)) => {
            let ring = KeyRing::load(path).map_err(|e| Failure::Usage(e.to_string()))?;
            Some(Signer::new(key_id, ring).map_err(|e| Failure::Usage(e.to_string()))?)
        }
        _ => None,
    };
    let ca_pem = match &args.tls_ca {
        Some(path) => {
            Some(HttpTransport::read_ca(path).map_err(|e| Failure::Usage(e.to_string()))?)
        }
        None => None,
    };
    let options = ClientOptions {
        timeout: Duration::from_millis(args.timeout_ms),
        ca_pem,
        ..ClientOptions::default()
    };
    HttpTransport::new(url, signer, &options).map_err(|e| Failure::Usage(e.to_string()))
}
