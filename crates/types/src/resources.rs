//! Resource quantities: the [`Resources`] vector that requests and capacities are made of, its
//! dimensions ([`Dim`]), and the user-facing spellings (`1GB`, `H100x8`, `0.5` cores).

use std::fmt;

/// A resource vector: what a task requests, or what a worker or backend offers.
///
/// A request asks for a dimension when its value is `> 0`. Fit checks cpu, memory, gpu and tpu;
/// disk is carried but never checked (as in Iris).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Resources {
    /// CPU in millicores.
    pub cpu_millicores: i64,
    /// Memory in bytes.
    pub memory_bytes: i64,
    /// Disk in bytes (not checked by fit).
    pub disk_bytes: i64,
    /// GPU count.
    pub gpu: i64,
    /// TPU chip count.
    pub tpu: i64,
}

/// A dimension of [`Resources`] that a request can ask for and fit checks: every field but disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    /// [`Resources::cpu_millicores`].
    Cpu,
    /// [`Resources::memory_bytes`].
    Memory,
    /// [`Resources::gpu`].
    Gpu,
    /// [`Resources::tpu`].
    Tpu,
}

impl Dim {
    /// Every checked dimension, in cpu, memory, gpu, tpu order.
    pub const CHECKED: [Dim; 4] = [Dim::Cpu, Dim::Memory, Dim::Gpu, Dim::Tpu];

    /// Lower-case name, as shown to users (`cpu`, `memory`, `gpu`, `tpu`).
    pub fn name(self) -> &'static str {
        match self {
            Dim::Cpu => "cpu",
            Dim::Memory => "memory",
            Dim::Gpu => "gpu",
            Dim::Tpu => "tpu",
        }
    }

    /// An amount of this dimension with its unit, e.g. `4000m`, `16 GiB`, `8`.
    pub fn amount(self, v: i64) -> String {
        match self {
            Dim::Cpu => format!("{v}m"),
            Dim::Memory => format_bytes(v),
            Dim::Gpu | Dim::Tpu => v.to_string(),
        }
    }
}

/// Human-readable byte count: `512 MiB`, `16 GiB`, `1.5 GiB`.
fn format_bytes(v: i64) -> String {
    const KIB: i64 = 1 << 10;
    const MIB: i64 = 1 << 20;
    const GIB: i64 = 1 << 30;
    let (unit, name) = match v.unsigned_abs() {
        a if a >= GIB as u64 => (GIB, "GiB"),
        a if a >= MIB as u64 => (MIB, "MiB"),
        a if a >= KIB as u64 => (KIB, "KiB"),
        _ => return format!("{v} B"),
    };
    if v % unit == 0 {
        format!("{} {name}", v / unit)
    } else {
        format!("{:.1} {name}", v as f64 / unit as f64)
    }
}

impl Resources {
    /// Only cpu and memory.
    pub fn cpu_mem(cpu_millicores: i64, memory_bytes: i64) -> Resources {
        Resources {
            cpu_millicores,
            memory_bytes,
            ..Resources::default()
        }
    }

    /// The value of one checked dimension.
    pub fn get(&self, d: Dim) -> i64 {
        match d {
            Dim::Cpu => self.cpu_millicores,
            Dim::Memory => self.memory_bytes,
            Dim::Gpu => self.gpu,
            Dim::Tpu => self.tpu,
        }
    }

    /// The dimensions this request asks for (`> 0`), in cpu, memory, gpu, tpu order.
    pub fn requested(&self) -> impl Iterator<Item = Dim> + '_ {
        Dim::CHECKED.into_iter().filter(|d| self.get(*d) > 0)
    }

    /// True if this request fits in `free` on every requested dimension.
    pub fn fits_in(&self, free: &Resources) -> bool {
        (self.cpu_millicores <= 0 || self.cpu_millicores <= free.cpu_millicores)
            && (self.memory_bytes <= 0 || self.memory_bytes <= free.memory_bytes)
            && (self.gpu <= 0 || self.gpu <= free.gpu)
            && (self.tpu <= 0 || self.tpu <= free.tpu)
    }
}

/// Requested dimensions only, e.g. `cpu=1000m, memory=4 GiB, gpu=8`; `nothing` if none.
impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for d in self.requested() {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{}={}", d.name(), d.amount(self.get(d)))?;
        }
        if first {
            f.write_str("nothing")?;
        }
        Ok(())
    }
}

/// Parses a memory/disk size: a plain byte count, or a number with a binary unit
/// (`K`, `KB`, `KiB`, `M`, `MB`, `G`, `GB`, `T`, … — all powers of 1024, as the reference does).
pub fn parse_bytes(s: &str) -> Result<i64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| {
        format!(
            "invalid size {}: expected a number with an optional unit, e.g. 512MB or 4GB",
            crate::quoted(s)
        )
    })?;
    if n < 0.0 || !n.is_finite() {
        return Err(format!(
            "invalid size {}: must not be negative",
            crate::quoted(s)
        ));
    }
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "invalid size {}: unknown unit {} (use KB, MB, GB or TB)",
                crate::quoted(s),
                crate::quoted(other)
            ))
        }
    };
    Ok((n * mult) as i64)
}

/// Parses a cpu count in cores (`0.5`, `2`) into millicores.
pub fn parse_cpu(s: &str) -> Result<i32, String> {
    let v: f64 = s.trim().parse().map_err(|_| {
        format!(
            "invalid cpu {}: expected a number of cores, e.g. 0.5 or 4",
            crate::quoted(s)
        )
    })?;
    if v.is_nan() || v <= 0.0 || !v.is_finite() {
        return Err(format!(
            "invalid cpu {}: must be greater than 0",
            crate::quoted(s)
        ));
    }
    if v > 100_000.0 {
        return Err(format!(
            "invalid cpu {}: at most 100000 cores",
            crate::quoted(s)
        ));
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
        format!(
            "invalid --gpu {}: expected VARIANTxCOUNT (H100x8), COUNT (8) or VARIANT (H100)",
            crate::quoted(s)
        )
    };
    if t.is_empty() {
        return Err(err());
    }
    if let Ok(n) = t.parse::<i32>() {
        if n <= 0 {
            return Err(format!(
                "invalid --gpu {}: count must be at least 1",
                crate::quoted(s)
            ));
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
    fn resources_display_requested_dimensions() {
        let mut r = Resources::cpu_mem(1000, 4 << 30);
        r.gpu = 8;
        r.disk_bytes = 1 << 40;
        assert_eq!(r.to_string(), "cpu=1000m, memory=4 GiB, gpu=8");
        assert_eq!(Resources::default().to_string(), "nothing");
        assert_eq!(Dim::Memory.amount(1536 << 20), "1.5 GiB");
        assert_eq!(Dim::Memory.amount(512), "512 B");
    }

    #[test]
    fn fit_ignores_unrequested_dimensions_and_disk() {
        let free = Resources::cpu_mem(2000, 1 << 30);
        let mut req = Resources::cpu_mem(2000, 0);
        req.disk_bytes = 1 << 50;
        assert!(req.fits_in(&free));
        req.gpu = 1;
        assert!(!req.fits_in(&free));
    }

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
