-- Argo CD health check for kvgate.io/KVCacheRollout.
-- Install as resource.customizations.health.kvgate.io_KVCacheRollout in argocd-cm
-- (see charts/kvgate/README.md). Written for Lua 5.1 (Argo CD runs gopher-lua).
--
--   Healthy      Promoted, NotNeeded; in report mode any verdict, pass (AwaitingApproval
--                with reason VerdictReported) or no (RolledBack): nothing was changed;
--                in gate mode only a passing verdict (AwaitingApproval, VerdictReported)
--                that is not Stale (the engine image changed since: Progressing)
--   Degraded     RolledBack, Failed, Declined (pullRequest mode: the PR was closed); or the Stalled condition is True (e.g. InvalidSpec,
--                RevertFailed); or Drifted is True after Promoted; in gate mode every end
--                but a passing verdict (NotNeeded too: the gate fails closed)
--   Suspended    AwaitingApproval (manual mode: waits for kvgate.io/approve=<configHash>),
--                PullRequestOpen (pullRequest mode: waits for a person to merge the PR)
--   Progressing  every other phase, and until the operator has seen the latest spec
local hs = {}

local function condition(status, ctype)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == ctype then
      return c
    end
  end
  return nil
end

local function describe(status, fallback)
  if status.message ~= nil and status.message ~= "" then
    return status.message
  end
  return fallback
end

-- "Phase: message", or the phase alone while the operator has written no message.
local function with_phase(phase, status)
  local text = describe(status, "")
  if text == "" then
    return phase
  end
  return phase .. ": " .. text
end

local status = obj.status
if status == nil or status.phase == nil or status.phase == "" then
  hs.status = "Progressing"
  hs.message = "Waiting for the kvgate operator to pick up the rollout"
  return hs
end

local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local stalled = condition(status, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = (stalled.reason or "Stalled") .. ": " .. (stalled.message or "")
  return hs
end

-- After Promoted: the Deployment no longer carries the promoted config (kvgate never re-applies).
local drifted = condition(status, "Drifted")
if drifted ~= nil and drifted.status == "True" then
  hs.status = "Degraded"
  hs.message = "Drifted: " .. (drifted.message or "")
  return hs
end

local phase = status.phase
local mode = "auto"
if obj.spec ~= nil and obj.spec.promotion ~= nil and obj.spec.promotion.mode ~= nil then
  mode = obj.spec.promotion.mode
end

-- Gate mode is the sync's gate: only a passing verdict opens it; any other end closes it (the
-- operator also sets Stalled=True, which the check above reads first); a running one holds it.
if mode == "gate" then
  local stale = condition(status, "Stale")
  if stale ~= nil and stale.status == "True" then
    -- the engine changed under a passing verdict: hold the next sync until it is evaluated again
    hs.status = "Progressing"
    hs.message = "Verdict stale: " .. (stale.message or "")
  elseif phase == "AwaitingApproval" and status.reason == "VerdictReported" then
    hs.status = "Healthy"
    hs.message = "Gate open: " .. describe(status, phase)
  elseif phase == "Promoted" or phase == "RolledBack" or phase == "NotNeeded" or phase == "Failed" then
    hs.status = "Degraded"
    hs.message = "Gate closed: " .. describe(status, phase)
  else
    hs.status = "Progressing"
    hs.message = with_phase(phase, status)
  end
  return hs
end

-- Report mode never touches the Deployment: a verdict, even "no", is a healthy result.
-- A passing verdict parks in AwaitingApproval (reason VerdictReported) and waits for no one.
local verdict_phase = phase == "AwaitingApproval" or phase == "RolledBack" or phase == "NotNeeded" or phase == "Promoted"
if mode == "report" and verdict_phase then
  hs.status = "Healthy"
  hs.message = "Report: " .. describe(status, phase)
  return hs
end

if phase == "Promoted" or phase == "NotNeeded" then
  hs.status = "Healthy"
elseif phase == "RolledBack" or phase == "Failed" or phase == "Declined" then
  hs.status = "Degraded"
elseif phase == "AwaitingApproval" or phase == "PullRequestOpen" then
  hs.status = "Suspended"
else
  hs.status = "Progressing"
end
hs.message = with_phase(phase, status)
return hs
