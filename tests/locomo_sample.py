"""A two-session conversation in LoCoMo's schema, for the benchmark harness tests."""

SESSIONS = {
    "session_1_date_time": "1:56 pm on 8 May, 2023",
    "session_1": [
        {"speaker": "Ana", "dia_id": "D1:1", "text": "I adopted a grey cat named Miso. She sleeps on my piano."},
        {"speaker": "Ben", "dia_id": "D1:2", "text": "Lovely! I started training for the Berlin marathon."},
        {"speaker": "Ana", "dia_id": "D1:3", "text": "Good luck with the training."},
    ],
    "session_2_date_time": "10:04 am on 20 June, 2023",
    "session_2": [
        {"speaker": "Ben", "dia_id": "D2:1", "text": "I hurt my knee on a long run last week."},
        {"speaker": "Ana", "dia_id": "D2:2", "text": "Oh no. Miso knocked over my tea this morning."},
        {"speaker": "Ben", "dia_id": "D2:3", "text": "Cats! I will rest the knee until July."},
    ],
}
