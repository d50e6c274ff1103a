"""The conductor's side of moves: evacuation and live migration as
'compute-agent-ctl' and a conductor run them, with the move's source tree
read from Placement. It never reaches the daemon."""
