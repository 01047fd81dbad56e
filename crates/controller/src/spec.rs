//! A job's launch request decoded once and turned into scheduler inputs.

use iris_proto::cluster::controller::LaunchJobRequest;
use iris_proto::job::{self, device_config::Device, Constraint as PConstraint};
use iris_types::{AttrValue, Band, Constraint, ConstraintOp, Resources};

/// What the controller needs about a job at scheduling and dispatch time.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub request: LaunchJobRequest,
    pub resources: Resources,
    pub constraints: Vec<Constraint>,
    pub group_by: Option<String>,
    pub band: Band,
    pub device_variant: String,
    pub user: String,
    pub depth: u32,
    /// The job's task count: its replicas (at least 1), as its `jobs.num_tasks` row holds.
    pub num_tasks: u32,
}

/// `(device type, variant, gpu count, tpu count)` of a resource request.
pub fn device_of(res: Option<&job::ResourceSpecProto>) -> (&'static str, String, i64, i64) {
    match res
        .and_then(|r| r.device.as_ref())
        .and_then(|d| d.device.as_ref())
    {
        Some(Device::Gpu(g)) => ("gpu", g.variant.clone(), g.count.max(0) as i64, 0),
        Some(Device::Tpu(t)) => ("tpu", t.variant.clone(), 0, t.count.max(0) as i64),
        Some(Device::Cpu(_)) | None => ("cpu", String::new(), 0, 0),
    }
}

pub fn resources_of(res: Option<&job::ResourceSpecProto>) -> Resources {
    let (_, _, gpu, tpu) = device_of(res);
    Resources {
        cpu_millicores: res.map(|r| r.cpu_millicores as i64).unwrap_or(0),
        memory_bytes: res.map(|r| r.memory_bytes).unwrap_or(0),
        disk_bytes: res.map(|r| r.disk_bytes).unwrap_or(0),
        gpu,
        tpu,
    }
}

pub fn attr_from_proto(v: &job::AttributeValue) -> Option<AttrValue> {
    match v.value.as_ref()? {
        job::attribute_value::Value::StringValue(s) => Some(AttrValue::Str(s.clone())),
        job::attribute_value::Value::IntValue(i) => Some(AttrValue::Int(*i)),
        job::attribute_value::Value::FloatValue(f) => Some(AttrValue::Float(*f)),
    }
}

pub fn attr_to_proto(v: &AttrValue) -> job::AttributeValue {
    use job::attribute_value::Value;
    job::AttributeValue {
        value: Some(match v {
            AttrValue::Str(s) => Value::StringValue(s.clone()),
            AttrValue::Int(i) => Value::IntValue(*i),
            AttrValue::Float(f) => Value::FloatValue(*f),
        }),
    }
}

/// Converts a wire constraint; `Err` names the problem.
pub fn constraint_from_proto(c: &PConstraint) -> Result<Constraint, String> {
    let op = match c.op.unwrap_or_default() {
        0 => ConstraintOp::Eq,
        1 => ConstraintOp::Ne,
        2 => ConstraintOp::Exists,
        3 => ConstraintOp::NotExists,
        4 => ConstraintOp::Gt,
        5 => ConstraintOp::Ge,
        6 => ConstraintOp::Lt,
        7 => ConstraintOp::Le,
        8 => ConstraintOp::In,
        other => {
            return Err(format!(
                "constraints: unknown op {other} for key '{}'",
                c.key()
            ))
        }
    };
    if c.key().trim().is_empty() {
        return Err("constraints: key must not be empty".into());
    }
    let value = c.value.as_ref().and_then(attr_from_proto);
    if value.is_none()
        && !matches!(
            op,
            ConstraintOp::Exists | ConstraintOp::NotExists | ConstraintOp::In
        )
    {
        return Err(format!(
            "constraints: {} {} needs a value",
            c.key(),
            op.name()
        ));
    }
    if op == ConstraintOp::In && c.values.is_empty() {
        return Err(format!(
            "constraints: {} IN needs at least one value",
            c.key()
        ));
    }
    Ok(Constraint {
        key: c.key.clone().unwrap_or_default(),
        op,
        value,
        values: c.values.iter().filter_map(attr_from_proto).collect(),
        required: c.mode != Some(1),
    })
}

impl JobSpec {
    /// Builds the spec from a stored request. Constraint errors were rejected at submit.
    pub fn from_request(request: LaunchJobRequest, band: Band, user: String, depth: u32) -> Self {
        let (_, variant, _, _) = device_of(request.resources.as_ref());
        let resources = resources_of(request.resources.as_ref());
        let constraints = request
            .constraints
            .iter()
            .filter_map(|c| constraint_from_proto(c).ok())
            .collect();
        let group_by = request
            .coscheduling
            .as_ref()
            .map(|c| c.group_by.clone())
            .filter(|g| !g.is_empty());
        let num_tasks = request.replicas().max(1) as u32;
        JobSpec {
            request,
            resources,
            constraints,
            group_by,
            band,
            device_variant: variant.to_ascii_lowercase(),
            user,
            depth,
            num_tasks,
        }
    }
}
