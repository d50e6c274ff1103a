"""The conductor's side of moves: evacuation and live migration as
'compute-agent-ctl' and a conductor run them, with the move's source tree
read from Placement. Imports the RPC client, placement, moves and the base;
never the daemon."""
