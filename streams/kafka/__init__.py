"""The Kafka layer: topic registry, the records laneway writes and how they are
delivered, faust's transport.
"""
