"""Weight transports: how the bytes of a weight update travel from the trainer to the rollout replicas.

One module per part, and nothing here imports them (so any one can be imported alone):

* `codec`: the wire format (`WeightHeader`, tensor bytes in canonical order, sha256); pure, no I/O.
* `base`: the two sides every transport implements, `WeightSender` (trainer) and `WeightSource` (replica).
* `stream`, `data_port`, `relay`, `broadcast`: one module per transport.
* `receiver`: the replica's `WeightAssembler`, which checks every update the same way, whatever carried it.

Every update has the same control path, whatever carries its bytes: one authenticated UpdateWeights
call whose first message is the `WeightHeader` (version, tensor specs, sha256), answered with the
version and checksum the replica loaded. A transport decides only how the bytes get into the
replica's receive buffer:

* `StreamSender` / `StreamSource` (`stream`): in the gRPC stream, after the header. Always available;
  every other transport falls back to it.
* `DataPortSender` / `DataPortSource` (`data_port`): on a side TCP connection named by a one-time token in
  the call's metadata, ~3x faster.
* `BroadcastSender` / `BroadcastSource` (`broadcast`): one collective send (gloo on CPU, NCCL on GPU) to every
  replica of a group the trainer hosts (`WeightBroadcaster`), named by an invitation in each call's metadata.
  It updates many replicas at once; the ones it did not update are pushed to the next way
  (docs/gpu-weight-broadcast.md).

Between the first two, the replica's one setting, `weights_data_port` (-1: stream only), decides: the
replica advertises the port in the Redis registry and in GetStatus, and `data_port.sender_for` picks the
transport from that advertisement, so trainer and replica cannot disagree. The broadcast is the
trainer's choice (`weight_transport`); a replica that cannot join falls back like any other failure.

Either sender goes to one replica. Relay fan-out (`relay`) sends one copy into a tree of replicas instead:
a replica with children in the call's `RelayPlan` forwards its receive buffer to them as it fills, over the
same two transports, and every replica still checks what it got itself.

The trainer pushes through `base.FleetSender`, one interface for every way (direct, relay, broadcast): a
round's targets in, one result per target out (None: not updated this way, so the next way tries). The
trainer's `weight_push` and `weight_transport` settings pick which ways, in order (grpo.trainer.pusher).

A new backend (NCCL broadcast, a shared-memory or filesystem drop) is one module with a
`WeightSender` and a `WeightSource`: the sender starts the bytes moving and makes the UpdateWeights
call with the header (naming the bytes in the call's metadata, as the data port names its token);
the source, given that metadata on the replica, puts exactly the header's `total_bytes` into the
`WeightAssembler` (`receive` for bytes that come before the header) and feeds it the call's
messages. The assembler checks size, specs, version and sha256 the same way for every transport,
so nothing is applied that the header does not vouch for. Wire it into `sender_for` and the
replica's `WeightUpdates.source` with whatever it advertises.
"""
