//! Resource quantities and their user-facing spellings (`1GB`, `H100x8`, `0.5` cores).

/// Parses a memory/disk size: a plain byte count, or a number with a binary unit
/// (`K`, `KB`, `KiB`, `M`, `MB`, `G`, `GB`, `T`, … — all powers of 1024, as the reference does).
pub fn parse_bytes(s: &str) -> Result<i64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| {
        format!("invalid size {s:?}: expected a number with an optional unit, e.g. 512MB or 4GB")
    })?;
    if n < 0.0 || !n.is_finite() {
        return Err(format!("invalid size {s:?}: must not be negative"));
    }
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "invalid size {s:?}: unknown unit {other:?} (use KB, MB, GB or TB)"
            ))
        }
    };
    Ok((n * mult) as i64)
}

/// Parses a cpu count in cores (`0.5`, `2`) into millicores.
pub fn parse_cpu(s: &str) -> Result<i32, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("invalid cpu {s:?}: expected a number of cores, e.g. 0.5 or 4"))?;
    if v.is_nan() || v <= 0.0 || !v.is_finite() {
        return Err(format!("invalid cpu {s:?}: must be greater than 0"));
    }
    if v > 100_000.0 {
        return Err(format!("invalid cpu {s:?}: at most 100000 cores"));
    }
    Ok((v * 1000.0).round() as i32)
}

/// An accelerator request: `H100x8`, `8` (any variant), or `H100` (one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceleratorSpec {
    pub variant: String,
    pub count: i32,
}

pub fn parse_gpu(s: &str) -> Result<AcceleratorSpec, String> {
    let t = s.trim();
    let err = || {
        format!("invalid --gpu {s:?}: expected VARIANTxCOUNT (H100x8), COUNT (8) or VARIANT (H100)")
    };
    if t.is_empty() {
        return Err(err());
    }
    if let Ok(n) = t.parse::<i32>() {
        if n <= 0 {
            return Err(format!("invalid --gpu {s:?}: count must be at least 1"));
        }
        return Ok(AcceleratorSpec {
            variant: "auto".into(),
            count: n,
        });
    }
    if let Some((v, n)) = t.rsplit_once(['x', 'X']) {
        if let Ok(n) = n.parse::<i32>() {
            if n <= 0 || v.is_empty() {
                return Err(err());
            }
            return Ok(AcceleratorSpec {
                variant: v.to_string(),
                count: n,
            });
        }
    }
    if t.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Ok(AcceleratorSpec {
            variant: t.to_string(),
            count: 1,
        });
    }
    Err(err())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("1GB"), Ok(1 << 30));
        assert_eq!(parse_bytes("5GB"), Ok(5 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("100"), Ok(100));
        assert!(parse_bytes("-1GB").is_err());
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("3 parsecs").is_err());
    }

    #[test]
    fn cpus() {
        assert_eq!(parse_cpu("0.1"), Ok(100));
        assert_eq!(parse_cpu("12"), Ok(12000));
        assert!(parse_cpu("-1").is_err());
        assert!(parse_cpu("0").is_err());
    }

    #[test]
    fn gpus() {
        assert_eq!(
            parse_gpu("H100x8"),
            Ok(AcceleratorSpec {
                variant: "H100".into(),
                count: 8
            })
        );
        assert_eq!(
            parse_gpu("8"),
            Ok(AcceleratorSpec {
                variant: "auto".into(),
                count: 8
            })
        );
        assert_eq!(
            parse_gpu("GB200"),
            Ok(AcceleratorSpec {
                variant: "GB200".into(),
                count: 1
            })
        );
        assert!(parse_gpu("H100x0").is_err());
        assert!(parse_gpu("-3").is_err());
    }
}
