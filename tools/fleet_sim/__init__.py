"""A fleet of real agents against one Placement and one RabbitMQ
(tools/fleet; docs/scale.md)."""
