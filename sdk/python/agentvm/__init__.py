"""agentvm: the AgentVM SDK (standard library only). Agents in microVMs that sleep between calls: run commands and move
files in them, call them, checkpoint them, keep warm pools that reset per episode."""

from .client import DEFAULT_BASE_URL, Agent, Agents, AgentVM, ExecEvent, ExecExit, ExecResult, Files, Pool, Pools, Process
from .errors import AgentVMError

__all__ = ["AgentVM", "AgentVMError", "Agent", "Agents", "Files", "Process", "Pool", "Pools", "ExecResult", "ExecEvent", "ExecExit", "DEFAULT_BASE_URL"]
__version__ = "0.1.0"
