//! `relay --to URL`: the HTTP client transport, built from the flags.

use std::time::Duration;

use ordo_http::{ClientOptions, HttpTransport, KeyRing, Signer};

use crate::args::RelayArgs;
use crate::stores::AnyProducer;
use crate::Failure;

/// Refuses `transport` when its key is bound to another producer than
/// `producer`'s name (nothing is sent then).
pub fn check_key_producer(
    transport: &HttpTransport,
    producer: &mut AnyProducer,
    args: &RelayArgs,
) -> Result<(), Failure> {
    let store = producer.handle();
    let name = store.producer_name();
    let bound = transport
        .signer()
        .and_then(|s| s.producer().map(|bound| (s, bound)));
    if let Some((signer, bound)) = bound.filter(|(_, bound)| *bound != name) {
        let file = args
            .key_file
            .as_deref()
            .expect("a signer is read from --key-file");
        return Err(Failure::Usage(format!(
            "--key-id {} is bound to producer {bound} in {}, but the producer store {} is named {name}; nothing was sent",
            signer.key_id(),
            file.display(),
            args.producer,
        )));
    }
    Ok(())
}

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
