//! The committed C header must be exactly what cbindgen generates from src/ffi.

use std::path::Path;

#[test]
fn committed_header_matches_cbindgen() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml"))?;
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(root)
        .with_config(config)
        .generate()?
        .write(&mut generated);
    let path = root.join("include/correx.h");
    if std::env::var_os("CORREX_BLESS").is_some() {
        std::fs::write(&path, &generated)?;
        return Ok(());
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/correx.h is stale; regenerate it with CORREX_BLESS=1 cargo test --test tests header"
    );
    Ok(())
}
