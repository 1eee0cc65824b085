//! The installed llama-server is portable: it contains none of ggml's AMX kernels, whatever CPU
//! built it. The check reads the binary's disassembly, so it runs the same on a machine with AMX
//! and on one without.

use crate::util::{llama_install, TempDir};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

/// AMX instruction mnemonics as objdump prints them.
const AMX_MNEMONICS: &[&str] = &[
    "ldtilecfg",
    "sttilecfg",
    "tileloadd",
    "tileloaddt1",
    "tilestored",
    "tilerelease",
    "tilezero",
    "tdpbssd",
    "tdpbsud",
    "tdpbusd",
    "tdpbuud",
    "tdpbf16ps",
    "tdpfp16ps",
];

/// Every AMX instruction in `binary`'s disassembly, as `mnemonic` lines (at most 10).
fn amx_instructions(binary: &Path) -> Vec<String> {
    let mut child = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(binary)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("objdump runs (install binutils)");
    let out = child.stdout.take().expect("piped stdout");
    let mut found = Vec::new();
    for line in BufReader::new(out).lines() {
        let line = line.expect("objdump output");
        // "  4011d6:\tldtilecfg (%rdi)": the mnemonic is the first word after the address.
        let Some((_, insn)) = line.split_once(":\t") else {
            continue;
        };
        let mnemonic = insn.split_whitespace().next().unwrap_or("");
        if AMX_MNEMONICS.contains(&mnemonic) && found.len() < 10 {
            found.push(line.trim().to_string());
        }
    }
    let status = child.wait().expect("objdump exits");
    assert!(status.success(), "objdump failed on {}", binary.display());
    found
}

#[cfg(target_arch = "x86_64")]
#[test]
fn installed_llama_server_contains_no_amx_instructions() {
    let Some(install) = llama_install() else {
        return;
    };
    let found = amx_instructions(&install.server);
    assert!(
        found.is_empty(),
        "{} contains AMX instructions, which crash on CPUs that list AMX without enabling it: {found:?}",
        install.server.display()
    );
}

/// The check above can fail: an object holding one AMX instruction is caught.
#[cfg(target_arch = "x86_64")]
#[test]
fn amx_check_finds_an_amx_instruction() {
    let dir = TempDir::new("amx");
    let src = dir.join("amx.c");
    std::fs::write(
        &src,
        "void configure(const void *cfg) { __asm__ volatile(\"ldtilecfg (%0)\" :: \"r\"(cfg)); }\n\
         void plain(int *x) { *x += 1; }\n",
    )
    .expect("write source");
    let obj = dir.join("amx.o");
    let status = Command::new("cc")
        .args(["-O1", "-c", "-mamx-tile"])
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .status()
        .expect("cc runs");
    assert!(status.success(), "cc could not assemble ldtilecfg");
    let found = amx_instructions(&obj);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("ldtilecfg"), "{found:?}");
}

/// The recorded build configuration names no native or AMX build.
#[test]
fn installed_llama_server_build_is_not_native() {
    let Some(install) = llama_install() else {
        return;
    };
    let Some(cache) = correx::LlamaInstall::cache_dir() else {
        return;
    };
    if std::env::var_os("CORREX_LLAMA_SERVER").is_some() {
        // A server named by hand has no recorded configuration.
        return;
    }
    let env = std::fs::read_to_string(cache.join("env")).expect("the install's env file");
    let config = env
        .lines()
        .find_map(|l| l.strip_prefix("llama_build="))
        .unwrap_or_else(|| panic!("no llama_build line in the env file for {install:?}: rerun scripts/install-llama.sh"));
    assert!(config.contains("-DGGML_NATIVE=OFF"), "{config}");
    assert!(!config.contains("AMX_TILE=ON"), "{config}");
    assert!(!config.contains("AMX_INT8=ON"), "{config}");
}

/// The install leaves no scratch folders (downloads, sources, build trees) in the cache.
#[test]
fn install_leaves_no_scratch_folders_in_the_cache() {
    if llama_install().is_none() || std::env::var_os("CORREX_LLAMA_SERVER").is_some() {
        return;
    }
    let Some(cache) = correx::LlamaInstall::cache_dir() else {
        return;
    };
    let left: Vec<String> = std::fs::read_dir(&cache)
        .expect("the cache directory")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            ["build.", "src.", "model."]
                .iter()
                .any(|p| n.starts_with(p))
        })
        .collect();
    assert!(
        left.is_empty(),
        "scratch folders left in {}: {left:?}",
        cache.display()
    );
}

/// The library's idea of the installed model (which `correx doctor` checks) is the script's.
#[test]
fn the_model_checksum_the_library_knows_is_the_install_scripts() {
    let script = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/install-llama.sh"),
    )
    .expect("read the install script");
    let value = |key: &str| {
        script
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_owned)
    };
    assert_eq!(
        value("MODEL_SHA256").as_deref(),
        Some(correx::LlamaInstall::MODEL_SHA256)
    );
    assert_eq!(
        value("MODEL_BYTES").and_then(|b| b.parse::<u64>().ok()),
        Some(correx::LlamaInstall::MODEL_BYTES)
    );
}
