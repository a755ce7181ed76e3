"""Short facts that share words, so even feature-hashing embeddings grow summaries."""

FACTS = [
    "Maya adopted a rescue greyhound called Pepper.",
    "Pepper the greyhound is scared of bicycles.",
    "Pepper the greyhound sleeps on the sofa all day.",
    "Leo ate chicken ramen with yuzu in Kyoto.",
    "Leo ate ramen twice in Kyoto and once in Tokyo.",
    "Maya ran the Lisbon half marathon in October.",
    "Maya hurt her left knee on a hill session in May.",
    "Leo painted a plate at a Kutani pottery workshop.",
]
