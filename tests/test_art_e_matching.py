"""The deterministic answer matcher on a table of right and wrong answers (the issue's cases among them)."""

import pytest

from evals.art_e.rewards import answer_matches

RIGHT = [
    ("It was $3,000.", "$3000"),
    ("3,000 dollars", "$3,000"),
    ("$3k", "$3,000"),
    ("$6 million", "$6MM"),
    ("USD 1,200", "$1,200.00"),
    ("Jan. 18, 2001", "January 18"),
    ("1/18/01", "2001-01-18"),
    ("Thursday, January 18th", "January 18, 2001"),
    ("the 18th of January", "Jan 18"),
    ("10:00 a.m. on Jan 18", "January 18 at 10 AM"),
    ("at 2pm on March 3", "March 3 at 2:00 PM"),
    ("jan.moore@enron.com", "Jan Moore"),
    ("Jan Moore", "jan.moore@enron.com"),
    ("Sally Beck sent it", "sally.beck@enron.com"),
    ("It came from SALLY.BECK@ENRON.COM.", "sally.beck@enron.com"),
    ("(713) 853-6905", "713-853-6905"),
    ("853-6905", "713-853-6905"),
    ("ext. 35800", "x35800"),
    ("In EB 2626", "EB2626"),
    ("Allen, Phillip", "Phillip K Allen"),
    ("three", "3"),
    ("5 percent", "5%"),
    ("The meetings are in Houston", "meeting in Houston"),
    ("It is at Camp Pine Tree.", "Camp Pine Tree"),
    ("The PRC meeting is on June 15th", "June 15th"),
    ("27,500 MMBtu per day", "27,500 MMBtu/d"),
    ("$1.44 million", "$1.44m"),                            # a lowercase scale letter
    ("January 18, 2001", "January 18"),                     # a year after the day is not a second day
    ("Jan. 18 - 10 am", "January 18 at 10 AM"),             # nor is a time after a dash
    ("Sally Beck (sally.beck@enron.com)", "Sally Beck"),     # the same person twice
    ("Sally Beck, VP of Operations", "Sally Beck"),          # a list item that is no other candidate
    ("Sally Beck and John Doe", "John Doe and Sally Beck"),  # a reference that is itself a list
    ("Jan 18, 3-4 pm", "January 18"),                       # a time range after the day is no second day
    ("Monday, January 18, 9 - 10 AM", "January 18"),
    ("January 18, 3 days before the deadline", "January 18"),
    ("10:30, 18 January", "18 January at 10:30"),
    ("Sept 29/01", "September 29, 2001"),
    ("January 18 from 3 to 4 pm", "January 18, 3-4 pm"),
    ("Sally Beck, Enron Corp", "Sally Beck"),               # appositions are no rival candidates
    ("Sally Beck, Vice President", "Sally Beck"),
    ("Jeff Dasovich, Enron Government Affairs", "jeff.dasovich@enron.com"),
    ("EB 3270, Enron Building", "EB 3270"),
    ("Conference Room 21C2, Enron Center South", "Conference Room 21C2"),
    ("Camp Pine Tree, Lake Conroe", "Camp Pine Tree"),
    ("713-853-6905 / Sally Beck", "713-853-6905"),
    ("Sally Beck, sbeck@enron.com", "Sally Beck"),          # her own second address
    ("Sally Beck with her team", "Sally Beck"),
    ("January 18, then the review", "January 18"),
]

WRONG = [
    ("March 3 at 2 PM", "January 18 at 10 AM"),            # the probe: another day and time
    ("I think it was cancelled", "The meeting was moved to Friday"),
    ("$3000", "$300"),                                      # a digit more is another amount
    ("$10,000", "$10"),
    ("Not jan.moore@enron.com", "jan.moore@enron.com"),     # negated
    ("It was not Sally Beck", "Sally Beck"),
    ("It was either January 18 or January 19", "January 18"),  # hedged, several candidates
    ("January 18, 19 or 20", "January 18"),
    ("January 17, January 18 and January 19", "January 18"),
    ("Maybe $3,000", "$3,000"),
    ("Possibly Sally Beck", "Sally Beck"),
    ("I believe it is Camp Pine Tree", "Camp Pine Tree"),
    ("I don't know", "Sally Beck"),
    ("I do not know", "Sally Beck"),
    ("i dont know", "Sally Beck"),
    ("", "Sally Beck"),
    (None, "Sally Beck"),
    ("Sallye Beck", "Sally Beck"),                          # token boundaries
    ("Sally", "sally.beck@enron.com"),
    ("john.doe@enron.com and sally.beck@enron.com", "sally.beck@enron.com"),
    ("June 16", "June 15th"),
    ("June 15, 2002", "June 15, 2001"),                     # a different year
    ("10 PM on Jan 18", "January 18 at 10 AM"),
    ("853-6906", "713-853-6905"),
    ("EB 2627", "EB2626"),
    ("Phillip", "Phillip K Allen"),
    ("4%", "5%"),
    ("$6.2", "$6.2 million"),
    ("the budget review", "the Q4 budget review"),
    ("x35801", "x35800"),
    ("January 18, 19, 20", "January 18"),                   # candidate lists without a hedge word
    ("January 18 and 19", "January 18"),
    ("Jan 18-19", "January 18"),
    ("18 and 19 January", "January 18"),
    ("John Doe and Sally Beck", "Sally Beck"),
    ("Camp Pine Tree, Camp Oak", "Camp Pine Tree"),
    ("sally.beck@enron.com, john.doe@enron.com", "Sally Beck"),
    ("Sally Beck; Mike Carson", "Sally Beck"),
    ("Sally Beck and Mr. John A. Doe", "Sally Beck"),
    ("Room 12, Room 14", "Room 12"),
    ("June 26 - 30", "June 26"),                            # a range is several days
    ("January 18 to 20", "January 18"),
    ("January 18 and the 19th", "January 18"),
    ("from January 18 until 20", "January 18"),
    ("Sally Beck with John Doe", "Sally Beck"),
    ("Sally Beck, then John Doe", "Sally Beck"),
    ("Sally Beck vs. John Doe", "Sally Beck"),
]


def test_the_table_is_big_enough():
    assert len(RIGHT) + len(WRONG) >= 40


@pytest.mark.parametrize("answer,reference", RIGHT)
def test_right_answers_match(answer, reference):
    assert answer_matches(answer, reference)


@pytest.mark.parametrize("answer,reference", WRONG)
def test_wrong_answers_do_not_match(answer, reference):
    assert not answer_matches(answer, reference)


def test_bad_input_is_an_error():
    with pytest.raises(ValueError):
        answer_matches("x", "")
    with pytest.raises(TypeError):
        answer_matches(3000, "$3000")
